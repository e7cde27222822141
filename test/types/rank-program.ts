// What the types of a rank program's `rank` allow, checked by test/types.test.ts against the built
// package (imported by its name, as a user would): rank.tensor() makes a device tensor on 'cuda' and a
// host tensor on 'host', and a handle of either backend must be narrowed (by rank.backend, or by the
// tensor) before either kind is used. Each @ts-expect-error line is a misuse the types must refuse.
import type { DeviceTensor, RankProgramHandle, Tensor } from 'rankflow';

export async function onCuda(rank: RankProgramHandle<'cuda'>): Promise<void> {
  const x = rank.tensor('bf16', [4, 128]);
  const device: DeviceTensor<'bf16'> = x;
  // @ts-expect-error a device tensor holds no host data
  void x.data;
  const topkIdx = rank.tensor('int32', [4, 2], new Int32Array(8));
  const topkWeights = rank.tensor('fp32', [4, 2]);
  const d = await rank.dispatch({ x, topkIdx, topkWeights });
  const back = await rank.combine({ x: d.x, handle: d.handle });
  const y: DeviceTensor<'bf16'> = back.x;
  const host: Tensor<'bf16'> = y.toHost();
  // @ts-expect-error the data of a bf16 tensor is a Uint16Array
  rank.tensor('bf16', [2], new Float32Array(2));
  const theirs = rank.wrapDevice(0x7f0000000000n, 'fp32', [8], { owner: { free() {} } });
  const wrapped: DeviceTensor<'fp32'> = theirs;
  // @ts-expect-error wrapDevice takes the address as a BigInt
  rank.wrapDevice(0x7f0000000000, 'fp32', [8]);
  const stream: bigint = rank.cudaStream();
  const context: bigint = rank.cudaContext();
  rank.waitEvent(rank.recordEvent());
  // @ts-expect-error waitEvent takes a CUevent address as a BigInt
  rank.waitEvent(1);
  void [device, host, wrapped, stream, context];
}

export async function onHost(rank: RankProgramHandle<'host'>): Promise<void> {
  const x = rank.tensor('bf16', [4, 128]);
  x.data[0] = 0x3f80;
  const t: Tensor<'bf16'> = x;
  // @ts-expect-error a host tensor is not a device tensor
  x.free();
  // @ts-expect-error not a DeviceTensor
  const device: DeviceTensor<'bf16'> = x;
  const d = await rank.dispatch({ x, topkIdx: new Int32Array(8).fill(-1), topkWeights: new Float32Array(8) });
  const rows: Tensor = d.x;
  void [t, device, rows];
}

export async function onEither(rank: RankProgramHandle): Promise<void> {
  const t = rank.tensor('fp32', [2]);
  // @ts-expect-error on cuda it is a device tensor, with no host data
  void t.data;
  // @ts-expect-error on host it is a host tensor, with no free()
  t.free();
  if (t instanceof Object && 'device' in t) t.free();
  else t.data.fill(0);
  if (rank.backend === 'cuda') rank.tensor('fp32', [2]).free();
  else rank.tensor('fp32', [2]).data.fill(1);
  if (rank.backend !== 'cuda') return;
  const narrowed: RankProgramHandle<'cuda'> = rank;
  void narrowed;
}

declare const either: RankProgramHandle;
declare const cuda: RankProgramHandle<'cuda'>;
// A handle of one backend is a handle of either; not the other way round.
void onEither(cuda);
// @ts-expect-error a handle of either backend may be a host one
void onCuda(either);
// @ts-expect-error a cuda handle is not a host one
void onHost(cuda);
