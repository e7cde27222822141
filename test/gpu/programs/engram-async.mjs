// Rank program of test/gpu/agrs-inplace.test.mjs: engramWrite of this rank's table, then two fetches
// in flight at once while a barrier runs, waited for in reverse order. Returns the rows (on cuda
// device tensors of their own, read back), the states seen and how long issuing took.
export default async function engramAsync(rank, { tables, ids }) {
    await rank.engramWrite(tables[rank.rank]);
    const t0 = performance.now();
    const a = rank.engramFetch(ids[rank.rank][0], { async: true });
    const b = rank.engramFetch(ids[rank.rank][1], { async: true });
    const issueMs = performance.now() - t0;
    const during = rank.state;
    await rank.barrier();
    const rb = await b.wait();
    const ra = await a.wait();
    const read = (t) => (t.device ? t.toHost() : { dtype: t.dtype, shape: t.shape, data: t.data.slice() });
    const out = { a: read(ra), b: read(rb), device: !!ra.device, during, after: rank.state, issueMs };
    if (ra.device) (ra.free(), rb.free());
    return out;
}
