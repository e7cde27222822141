// Rank program (cuda): rank.allReduce of device tensors, which the peer reduce reads and writes where
// they lie (ranks sharing GPU 0 are threads of one process): `inputs[r]` into a new tensor and, of a
// copy, in place; then one allReduce captured as a CUDA graph and replayed once per `replays` entry,
// its input re-uploaded with `replays[k][r]` before each. Every result comes back as bytes.
const bytes = (t) => {
  const h = t.toHost().data;
  return new Uint8Array(h.buffer, h.byteOffset, h.byteLength).slice();
};

export default async function (rank, { inputs, replays }) {
  const input = inputs[rank.rank];
  const a = rank.tensor(input.dtype, input.shape, input.data);
  const out = await rank.allReduce(a);
  const b = rank.tensor(input.dtype, input.shape, input.data);
  const same = (await rank.allReduce(b, { inPlace: true })) === b;
  const result = { out: bytes(out), inPlace: bytes(b), same, replayed: [], inPlaceReplayed: [] };
  for (const t of [a, out, b]) t.free();

  const src = rank.tensor(input.dtype, input.shape, input.data);
  const inPlace = rank.tensor(input.dtype, input.shape, input.data);
  let sums;
  const graph = await rank.capture(async () => {
    sums = await rank.allReduce(src);
    await rank.allReduce(inPlace, { inPlace: true });
  });
  for (const next of replays) {
    src.upload(next[rank.rank].data);
    inPlace.upload(next[rank.rank].data);
    await graph.replay();
    result.replayed.push(bytes(sums));
    result.inPlaceReplayed.push(bytes(inPlace));
  }
  result.ops = graph.ops;
  graph.free();
  src.free();
  inPlace.free();
  return result;
}
