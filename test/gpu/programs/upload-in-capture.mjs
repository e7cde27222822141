// Rank program of test/gpu/shared-gpu-copies.test.mjs: an upload inside rank.capture() (a graph
// replays device work only, and a copy out of the rank's pinned staging would replay stale bytes) is
// refused; the rank stays usable: a barrier, an upload and a graph captured after it run. A tensor
// made without data inside a capture is zero-filled by a memset the graph replays: zero after each
// replay, even after an upload between two.
export default async function uploadInCapture(rank) {
    const t = rank.tensor('int32', [256]);
    let refused = null;
    try {
        await rank.capture(async () => t.upload(new Int32Array(256).fill(7)));
    } catch (e) {
        refused = { code: e.code, message: e.message };
    }
    await rank.barrier();
    t.upload(Int32Array.from({ length: 256 }, (_, i) => i + rank.rank));
    let z;
    const g = await rank.capture(async () => {
        z = rank.tensor('int32', [64]);
        await rank.barrier();
    });
    await g.replay();
    await rank.sync();
    const zeroed = [Array.from(z.toHost().data)];
    z.upload(new Int32Array(64).fill(5));
    const uploaded = Array.from(z.toHost().data);
    await g.replay();
    await rank.sync();
    zeroed.push(Array.from(z.toHost().data));
    g.free();
    const back = Array.from(t.toHost().data);
    t.free();
    return { refused, back, zeroed, uploaded, end: rank.state };
}
