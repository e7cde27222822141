// What the types of driver mode allow, checked by test/types.test.ts against the built package: a
// tensor's data is the typed array of its dtype, and that dtype carries through the collectives (a bf16
// dispatch's x is Uint16Array, an fp8 one's Uint8Array, with no cast), and Group is AsyncDisposable.
// Each @ts-expect-error line is a misuse the types must refuse.
import { createGroup, tensor, toBf16, type DispatchInput, type Group, type Tensor } from 'rankflow';

export async function bf16(group: Group): Promise<void> {
  const x = tensor('bf16', [4, 8], toBf16(new Float32Array(32)));
  const bits: Uint16Array = x.data;
  const inputs = group.ranks.map(() => ({ x, topkIdx: new Int32Array(4), topkWeights: new Float32Array(4) }));
  const out = await group.dispatch(inputs);
  const rows: Uint16Array = out[0]!.x.data;
  const back = await group.combine(out.map((d) => ({ x: d.x, handle: d.handle })));
  const sums: Uint16Array = back[0]!.x.data;
  const gathered: Float32Array = (await group.allGather([tensor('fp32', [2])]))[0]!.data;
  const passed: Int32Array = (await group.ppExchange([tensor('int32', [2])]))[0]!.data;
  // @ts-expect-error a bf16 tensor's data is a Uint16Array
  const wrong: Float32Array = x.data;
  // @ts-expect-error the data given must be the dtype's typed array
  tensor('fp32', [2], new Uint16Array(2));
  // @ts-expect-error only bf16 and fp8e4m3 tensors are dispatched
  await group.dispatch([{ x: tensor('fp32', [4, 8]), topkIdx: new Int32Array(4), topkWeights: new Float32Array(4) }]);
  void [bits, rows, sums, gathered, passed, wrong];
}

export async function fp8(group: Group, scales: Tensor<'fp32'>): Promise<void> {
  const out = await group.dispatch([{ x: tensor('fp8e4m3', [4, 128]), scales, topkIdx: new Int32Array(4), topkWeights: new Float32Array(4) }]);
  const bytes: Uint8Array = out[0]!.x.data;
  // @ts-expect-error an fp8 dispatch's x is not bf16
  const bits: Uint16Array = out[0]!.x.data;
  void [bytes, bits];
}

export async function either(group: Group, inputs: DispatchInput[]): Promise<void> {
  // Inputs of either dtype give results of either dtype: narrowed by the tensor's dtype.
  const x = (await group.dispatch(inputs))[0]!.x;
  // @ts-expect-error bf16 or fp8: the data may be a Uint8Array
  const bits: Uint16Array = x.data;
  if (x.dtype === 'bf16') {
    const narrowed: Tensor<'bf16'> = x as Tensor<'bf16'>;
    void narrowed;
  }
  void bits;
}

export async function scoped(): Promise<void> {
  await using group = await createGroup({ backend: 'host', buffer: { maxTokensPerRank: 4, hidden: 8, topk: 1, numExperts: 2 } });
  void group.size;
}
