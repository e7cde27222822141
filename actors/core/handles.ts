// The dispatch handles a rank handed out, so that a copy or a forged object ({ ...h, id: 999 }) is
// refused with EINVAL before any rank moves, and so are handles past the last MAX_LIVE_HANDLES
// dispatches, which the native side has forgotten (native/src/runtime/context.hpp kMaxLiveHandles).
import type { DispatchHandle } from './validate.js';

export const MAX_LIVE_HANDLES = 256;

export class HandleRegistry {
  private readonly live = new WeakSet<object>();
  private readonly order: DispatchHandle[] = [];

  add(h: DispatchHandle): void {
    this.live.add(h);
    this.order.push(h);
    if (this.order.length > MAX_LIVE_HANDLES) this.live.delete(this.order.shift()!);
  }

  has(h: unknown): boolean {
    return typeof h === 'object' && h !== null && this.live.has(h);
  }
}
