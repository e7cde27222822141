/**
 * Loopback only: the inspector binds and answers nothing else. These helpers say what counts as
 * loopback (127.0.0.0/8, ::1, the name localhost) for a bind address, a peer address and a Host
 * header, and turn the URL of `createGroup({ inspect: 'http://127.0.0.1:PORT' })` into listen
 * options.
 */

/**
 * Parses the `inspect` URL a group was given, 'http://127.0.0.1:9230' or 'http://localhost:0',
 * into listen options. Refuses anything but plain http on a loopback host.
 */
export function inspectorAddress(url: string): { host: string; port: number } {
    let parsed: URL;
    try {
        parsed = new URL(url);
    } catch {
        throw new RangeError(`inspect: '${url}' is not a URL; expected http://127.0.0.1:PORT`);
    }
    if (parsed.protocol !== 'http:') {
        throw new RangeError(`inspect: '${url}' must be an http:// URL (the inspector serves plain HTTP on loopback)`);
    }
    const host = parsed.hostname.replace(/^\[(.*)\]$/, '$1');
    if (!isLoopbackHost(host)) {
        throw new RangeError(`inspect: host '${parsed.hostname}' is not loopback; use 127.0.0.1, [::1] or localhost`);
    }
    return { host, port: parsed.port === '' ? 0 : Number(parsed.port) };
}

/** 127.0.0.0/8, ::1 or the name localhost. */
export function isLoopbackHost(host: string): boolean {
    const bare = host.replace(/^\[(.*)\]$/, '$1').toLowerCase();
    return bare === 'localhost' || isLoopbackAddress(bare);
}

export function isLoopbackAddress(address: string): boolean {
    const v4 = address.startsWith('::ffff:') ? address.slice(7) : address;
    return address === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(v4);
}

/** The host part of a Host header: 'localhost:9230' -> 'localhost', '[::1]:9230' -> '::1'. */
export function hostnameOf(hostHeader: string): string {
    const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(hostHeader);
    if (bracketed) return bracketed[1]!;
    return hostHeader.replace(/:\d+$/, '');
}
