// Rank program of test/gpu/scaleout.test.mjs (a cuda world over simulated nodes): a graph capture,
// which cuda refuses across nodes (BACKEND_UNAVAILABLE, before anything moves), then a barrier to
// show the rank usable and in step after it. Returns the refusal and the rank's state.
export default async function (rank) {
  const capture = await rank.capture(async () => { await rank.barrier(); })
    .then((graph) => { graph.free(); return null; }, (e) => ({ code: e.code, message: e.message }));
  await rank.barrier({ withCpuSync: true });
  return { capture, state: rank.state };
}
