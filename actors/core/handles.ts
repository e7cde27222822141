// The dispatch handles a rank handed out, so that a copy or a forged object ({ ...h, id: 999 }) is
// refused with EINVAL before any rank moves. At most MAX_LIVE_HANDLES live: each use (a cached
// dispatch, a combine) keeps a handle, and a new dispatch's handle pushes out the least recently used,
// as the native side does (native/src/runtime/context.hpp kMaxLiveHandles), so that a model's per-layer
// handles stay valid through any number of steps.
import type { DispatchHandle } from './validate.js';

export const MAX_LIVE_HANDLES = 256;

export class HandleRegistry {
  /** least recently used first */
  private readonly order: DispatchHandle[] = [];
  private readonly live = new WeakSet<object>();

  add(h: DispatchHandle): void {
    this.live.add(h);
    this.order.push(h);
    if (this.order.length > MAX_LIVE_HANDLES) this.live.delete(this.order.shift()!);
  }

  has(h: unknown): boolean {
    return typeof h === 'object' && h !== null && this.live.has(h);
  }

  /** A use: the handle becomes the most recently used. */
  touch(h: DispatchHandle): void {
    const i = this.order.lastIndexOf(h);
    if (i >= 0 && i !== this.order.length - 1) {
      this.order.splice(i, 1);
      this.order.push(h);
    }
  }
}
