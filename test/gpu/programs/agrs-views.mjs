// Rank program of test/gpu/agrs-inplace.test.mjs, for cuda and host groups alike: one AGRS session
// running `cases` (allGather 'ag' / reduceScatter 'rs' of this rank's `c.inputs[rank]`, written into
// a session tensor (inPlace) or given as a device tensor of its own (cuda) / the host tensor (host),
// with { async: true } or not); async ones waited for in `order`. Returns every result's bytes, and
// on cuda what shows zero copy: each session tensor's and result's address in the rank's window.
const put = (t, data) => (t.device ? t.upload(data) : t.data.set(data));
const read = (t) => (t.device ? t.toHost() : { dtype: t.dtype, shape: t.shape, data: t.data.slice() });

export default async function agrsViews(rank, { cases, maxBytes, maxAllGathers, order }) {
    const info = rank.info();
    const cuda = info.backend === 'cuda';
    const lo = info.window, hi = info.window + BigInt(info.symmetricBytes);
    const inWindow = (p) => p >= lo && p < hi;
    const s = await rank.openSession({ maxBytes, maxAllGathers });
    const pending = [], checks = [];
    for (const [i, c] of cases.entries()) {
        const input = c.inputs[rank.rank];
        let t;
        if (c.inPlace) {
            t = s.tensor(input.dtype, input.shape);
            put(t, input.data);
            if (cuda) checks.push({ i, what: 'tensor', ok: inWindow(t.ptr) && t.ptr - lo === BigInt(s.offsetOf(t)) });
        } else {
            t = cuda ? rank.tensor(input.dtype, input.shape, input.data) : input;
        }
        const run = (opts) => (c.op === 'ag' ? s.allGather(t, opts) : s.reduceScatter(t, opts));
        let h;
        if (c.async) {
            h = run({ async: true });
            if (i === 0) checks.push({ i, what: 'state', ok: rank.state === (c.op === 'ag' ? 'session.gathering' : 'session.reducing') });
        } else {
            const result = await run();
            h = { result, wait: async () => result };
        }
        pending.push({ h, t, c });
    }
    const results = new Array(cases.length);
    for (const i of order ?? pending.keys()) results[i] = await pending[i].h.wait();
    for (const [i, r] of results.entries()) {
        const { t, c } = pending[i];
        if (!cuda || !(c.async || c.inPlace)) continue;
        checks.push({ i, what: 'result', ok: inWindow(r.ptr) });
        // an in-place allGather's result region holds the tensor itself as my slot
        if (c.inPlace && c.op === 'ag') checks.push({ i, what: 'slot', ok: r.ptr + BigInt(rank.rank * t.bytes) === t.ptr });
    }
    const out = results.map(read);
    for (const { t, c } of pending) if (!c.inPlace && cuda) t.free();
    results.forEach((r, i) => cuda && !(cases[i].async || cases[i].inPlace) && r.free()); // owned copies
    const views = cuda ? results.filter((_, i) => cases[i].async || cases[i].inPlace) : [];
    await s.close();
    let revoked = true;
    for (const v of views) {
        try {
            void v.ptr;
            revoked = false;
        } catch (e) {
            revoked &&= e.code === 'STATE';
        }
    }
    return { out, checks, revoked, end: rank.state };
}
