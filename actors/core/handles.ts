// The dispatch handles a rank handed out, so that a copy or a forged object ({ ...h, id: 999 }) is
// refused with EINVAL before any rank moves. At most MAX_LIVE_HANDLES live: each use (a cached
// dispatch, a combine) keeps a handle, and a new dispatch's handle pushes out the least recently used,
// as the native side does (native/src/runtime/context.hpp kMaxLiveHandles), so that a model's per-layer
// handles stay valid through any number of steps.
import type { DispatchHandle } from './validate.js';

export const MAX_LIVE_HANDLES = 256;

export class HandleRegistry {
  /** live handles, least recently used first (a Map keeps insertion order) */
  private readonly live = new Map<object, true>();

  add(h: DispatchHandle): void {
    this.live.set(h, true);
    if (this.live.size > MAX_LIVE_HANDLES) this.live.delete(this.live.keys().next().value!);
  }

  has(h: unknown): boolean {
    return typeof h === 'object' && h !== null && this.live.has(h);
  }

  /** A use: the handle becomes the most recently used. */
  touch(h: DispatchHandle): void {
    if (this.live.delete(h)) this.live.set(h, true);
  }
}
