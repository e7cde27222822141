// An AGRS session (API.md, Sessions): all-gathers and reduce-scatters into the parts of the symmetric
// buffer the session reserved, in order, up to maxAllGathers of them, until close(). Its collectives
// queue on the group like every other. In an elastic group a membership change ends it (RANK_FAILED).
import { RankflowError, invalid } from './core/errors.js';
import { checkTensor, ELEMENT_BYTES, numel, type DType, type Tensor } from './core/tensor.js';
import { checkPerRank, checkSameShape } from './core/validate.js';
import type { Group } from './group.js';

/** An AGRS session: every rank is in its `session` state until close(). */
export class Session {
  private closed = false;
  /** collectives started in this session: the ranks refuse more than maxAllGathers */
  private collectives = 0;
  constructor(
    private readonly group: Group, readonly maxBytes: number, readonly maxAllGathers: number,
    /** elastic groups: RANK_FAILED once a rank left or joined since the session opened (the ranks' sessions end with it) */
    private readonly ended?: () => RankflowError | undefined,
  ) {}

  allGather<D extends DType>(tensors: Tensor<D>[]): Promise<Tensor<D>[]> {
    try {
      this.checkOpen();
      const list = checkPerRank<Tensor>('tensors', tensors, this.group.size);
      list.forEach((t, r) => checkTensor(`tensors[${r}]`, t, {}));
      checkSameShape('tensors', list);
      const bytes = numel(list[0]!.shape) * ELEMENT_BYTES[list[0]!.dtype];
      if (bytes > this.maxBytes) throw invalid('tensors', `${bytes} bytes per rank exceed the session's maxBytes (${this.maxBytes})`);
      this.takeSlot();
    } catch (e) {
      return Promise.reject(e);
    }
    return this.group.sessionCollective((all) => all((api, r) => api.sessionAllGather(tensors[r]!) as Promise<Tensor<D>>), this.ended);
  }

  reduceScatter<D extends DType>(tensors: Tensor<D>[]): Promise<Tensor<D>[]> {
    const W = this.group.worldSize;
    try {
      this.checkOpen();
      const list = checkPerRank<Tensor>('tensors', tensors, this.group.size);
      list.forEach((t, r) => {
        checkTensor(`tensors[${r}]`, t, { dtypes: ['fp32', 'bf16'] });
        if (t.shape.length < 1 || t.shape[0]! % W !== 0) throw invalid(`tensors[${r}].shape[0]`, `must be a multiple of the world size (${W}), got ${t.shape[0]}`);
      });
      checkSameShape('tensors', list);
      const bytes = (numel(list[0]!.shape) / W) * ELEMENT_BYTES[list[0]!.dtype];
      if (bytes > this.maxBytes) throw invalid('tensors', `${bytes} bytes per rank chunk exceed the session's maxBytes (${this.maxBytes})`);
      this.takeSlot();
    } catch (e) {
      return Promise.reject(e);
    }
    return this.group.sessionCollective((all) => all((api, r) => api.sessionReduceScatter(tensors[r]!) as Promise<Tensor<D>>), this.ended);
  }

  async close(): Promise<void> {
    if (!this.closed && this.ended?.()) {
      // Elastic: the group's re-forming closed the ranks' sessions; nothing is left to close.
      this.closed = true;
      this.group.sessionIsOpen = false;
      return;
    }
    this.checkOpen();
    await this.group.sessionCollective(async (all) => {
      await all((api) => api.sessionClose());
    });
    this.closed = true;
    this.group.sessionIsOpen = false;
  }

  private checkOpen(): void {
    if (this.closed) throw new RankflowError('STATE', 'this AGRS session is closed');
    const ended = this.ended?.();
    if (ended) throw ended;
  }

  /**
   * `await using s = await group.openSession(...)`: close() when the scope ends, unless the session is
   * closed already or its group is destroyed or failed (nothing is left to close then).
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.closed || this.group.disposedOrFailed) return;
    await this.close();
  }

  /** Every collective takes a fresh part of the session's buffer: refuse the one that would not fit. */
  private takeSlot(): void {
    if (this.collectives >= this.maxAllGathers)
      throw invalid('maxAllGathers', `this session allows ${this.maxAllGathers} collectives and all are used: close() it and open another`);
    this.collectives++;
  }
}
