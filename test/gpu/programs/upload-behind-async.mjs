// Rank program of test/gpu/shared-gpu-copies.test.mjs: async in-place allGathers of a session, each
// followed by a large upload from pageable host memory into a device tensor while the gather's put
// kernel still waits for its peers; the last rank starts `skewMs` late, so the others are uploading
// behind a waiting kernel while it has not yet launched its own. Returns every gather's bytes and
// the device tensor's bytes after the last upload.
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export default async function uploadBehindAsync(rank, { iters, rows, bigBytes, skewMs }) {
    const W = rank.worldSize;
    const s = await rank.openSession({ maxBytes: rows * 4, maxAllGathers: iters });
    const big = rank.tensor('int32', [bigBytes / 4]);
    const host = new Int32Array(bigBytes / 4);
    const pending = [];
    for (let i = 0; i < iters; i++) {
        if (rank.rank === W - 1 && i === 0) await sleep(skewMs);
        const t = s.tensor('int32', [rows]);
        t.upload(Int32Array.from({ length: rows }, (_, j) => rank.rank * 1_000_000 + i * rows + j));
        pending.push(s.allGather(t, { async: true }));
        host.fill(rank.rank * 100 + i);
        big.upload(host);
    }
    const out = [];
    for (const h of pending) out.push(Array.from((await h.wait()).toHost().data));
    const last = big.toHost().data;
    big.free();
    await s.close();
    return { out, lastFirst: last[0], lastEnd: last[last.length - 1], end: rank.state };
}
