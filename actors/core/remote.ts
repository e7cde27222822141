// A rank worker's API as the main thread calls it through comlink: every method returns a promise of
// what it returns in the worker. Declared here rather than taken from comlink's `Remote`: comlink's
// types name DOM globals (MessagePort, Transferable), so a user whose lib has no DOM (lib: ["ES2022"],
// skipLibCheck: false) would get errors from them through rankflow's declarations.
import * as Comlink from 'comlink/dist/esm/comlink.mjs';

export type Remote<T> = {
  [K in keyof T]: T[K] extends (...args: infer P) => infer R ? (...args: P) => Promise<Awaited<R>> : never;
};

/** comlink's proxy of a worker's API (`endpoint`: comlink's node adapter of the worker), typed as Remote<T>. */
export const wrapRemote = <T>(endpoint: object): Remote<T> => Comlink.wrap<T>(endpoint as Comlink.Endpoint) as unknown as Remote<T>;

/** Releases a proxy made by wrapRemote (its pending calls end; the worker can be collected). */
export function releaseRemote(api: Remote<unknown>): void {
  (api as unknown as Comlink.Remote<unknown>)[Comlink.releaseProxy]();
}
