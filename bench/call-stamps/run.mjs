// Where one call's time goes on a GPU: CPU stamps of a cuda rank's barrier, cached dispatch (128 tokens
// x 7168 bf16, top-8 of 256, outputs in the buffer) and combine (allocated outputs), each but the
// barrier followed by rank.sync(). Not part of the addon or of CI: the stamps live in a patch, applied
// to a worktree and built there (stamps.patch: clock_gettime into the scratch's words 300.., the
// scratch exposed to rank programs as rank.__scratch; RF_EXP_SYNC=q makes rank.sync() poll
// cuStreamQuery instead of spinning on the word a stream write gives, n asks that write for
// CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER):
//   git worktree add /tmp/stamps HEAD && cd /tmp/stamps && git apply bench/call-stamps/stamps.patch
//   npm ci && npx cmake-js compile --directory native --out build/native && npx tsc -p tsconfig.json
//   node bench/call-stamps/run.mjs [rounds]       (on the GPU machine; prints median µs per segment)
// complete-op-experiment.patch (on top of stamps.patch; with RF_EXP_SYNC=k and the waits.cc lines that
// bench/results/call-stamps-2026-12-02.md gives) had the op's last kernel write Control.completed_seq.
import { createGroup, sizeHint } from '../../dist/actors/index.js';

const ep = { maxTokensPerRank: 128, hidden: 7168, topk: 8, numExperts: 256 };
for (let r = 0; r < Number(process.argv[2] ?? 3); r++) {
  const g = await createGroup({ backend: 'cuda', ranks: 1, devices: [0], buffer: { ...ep, bytes: sizeHint(ep, 1) } });
  try {
    const [o] = await g.run(new URL('./prog.mjs', import.meta.url), { ...ep, iters: 3000 });
    for (const [op, segs] of Object.entries(o)) console.log(`round ${r} ${op}: ${Object.entries(segs).map(([k, v]) => `${k} ${v}`).join(' | ')}`);
  } finally {
    await g.destroy();
  }
}
