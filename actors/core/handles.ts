// The dispatch handles a rank handed out, so that a copy or a forged object ({ ...h, id: 999 }) is
// refused with EINVAL before any rank moves. At most MAX_LIVE_HANDLES live: each use (a cached
// dispatch, a combine) keeps a handle, and a new dispatch's handle pushes out the least recently used,
// as the native side does (native/src/runtime/context.hpp kMaxLiveHandles), so that a model's per-layer
// handles stay valid through any number of steps.
import type { DispatchHandle } from './validate.js';

export const MAX_LIVE_HANDLES = 256;

/** A live handle's place in the recency list. */
interface Entry {
  h: object;
  older: Entry | null;
  newer: Entry | null;
}

export class HandleRegistry {
  /** live handles and their entries */
  private readonly live = new Map<object, Entry>();
  /** the recency list: least recently used first; a use moves an entry to `newest` (no map write) */
  private oldest: Entry | null = null;
  private newest: Entry | null = null;

  /** A new handle, the most recently used; past MAX_LIVE_HANDLES the least recently used goes (its entry is reused). */
  add(h: DispatchHandle): void {
    if (this.live.has(h)) return;  // already live: it keeps its place
    let e: Entry;
    if (this.live.size >= MAX_LIVE_HANDLES) {
      e = this.oldest!;
      this.live.delete(e.h);
      this.unlink(e);
      e.h = h;
    } else e = { h, older: null, newer: null };
    this.live.set(h, e);
    this.append(e);
  }

  has(h: unknown): boolean {
    return typeof h === 'object' && h !== null && this.live.has(h);
  }

  /** A use: the handle becomes the most recently used. Whether it is live (nothing moves if not). */
  touch(h: DispatchHandle): boolean {
    const e = this.live.get(h);
    if (e === undefined) return false;
    if (e !== this.newest) {
      this.unlink(e);
      this.append(e);
    }
    return true;
  }

  private unlink(e: Entry): void {
    if (e.older) e.older.newer = e.newer;
    else this.oldest = e.newer;
    if (e.newer) e.newer.older = e.older;
    else this.newest = e.older;
    e.older = e.newer = null;
  }

  private append(e: Entry): void {
    e.older = this.newest;
    if (this.newest) this.newest.newer = e;
    else this.oldest = e;
    this.newest = e;
  }
}
