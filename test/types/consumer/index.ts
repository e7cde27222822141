// A user's project as test/package.test.ts builds it: the packed tarball installed into an empty
// project with @types/node, compiled by tsc with strict settings and skipLibCheck false, so every
// declaration rankflow ships is checked too (no deep import of an untyped module, no lib the user must
// add for Symbol.asyncDispose, the dtype of a tensor carried through the collectives).
import {
  createGroup, tensor, toBf16, fromBf16, sizeHint, RankflowError, TimelineRecorder, renderTimelineSvg, toChromeTrace,
  type DeviceTensor, type DispatchResult, type GroupOptions, type RankProgramHandle, type Tensor,
} from 'rankflow';
import type { RankContext } from 'rankflow/machines';

const buffer = { maxTokensPerRank: 4, hidden: 8, topk: 1, numExperts: 2 };
const options: GroupOptions = { backend: 'host', ranks: 2, buffer, timeouts: { cpuSeconds: 30 } };

export async function driver(): Promise<number> {
  const recorder = new TimelineRecorder();
  await using group = await createGroup({ ...options, observers: [recorder] });
  const x = tensor('bf16', [4, 8], toBf16(new Float32Array(32).fill(1)));
  const bits: Uint16Array = x.data;
  const out: DispatchResult<'bf16'>[] = await group.dispatch(group.ranks.map(() => ({ x, topkIdx: new Int32Array(4), topkWeights: new Float32Array(4).fill(1) })));
  const rows: Uint16Array = out[0]!.x.data;
  const back = await group.combine(out.map((d) => ({ x: d.x, handle: d.handle })));
  const sums: Float32Array = fromBf16(back[0]!.x.data);
  const gathered: Float32Array[] = (await group.allGather(group.ranks.map(() => tensor('fp32', [2])))).map((t) => t.data);
  group.on('failed', ({ rank, error }) => console.error(rank, error.code));
  const svg: string = renderTimelineSvg(recorder.recording());
  void toChromeTrace(recorder.recording());
  void [bits, rows, svg, gathered];
  return sums.length + sizeHint(buffer, 2);
}

export default async function program(rank: RankProgramHandle, args: { n: number }): Promise<void> {
  const t = rank.tensor('fp32', [args.n]);
  if (rank.backend === 'cuda') (t as DeviceTensor<'fp32'>).free();
  else (t as Tensor<'fp32'>).data.fill(rank.rank);
  await rank.barrier({ withCpuSync: true });
}

export function failed(e: unknown): string | undefined {
  return e instanceof RankflowError ? `${e.code} ${e.rank ?? ''}` : undefined;
}

export type Seq = RankContext['seq'];
