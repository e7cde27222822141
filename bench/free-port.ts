// A TCP port of 127.0.0.1 that was free a moment ago: the rendezvous address of a bench's world
// (bench/elastic-world.ts, bench/scaleout.ts, bench/layout.ts).
import net from 'node:net';

export async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const { port } = s.address() as net.AddressInfo;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}
