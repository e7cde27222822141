// Transitions as numbers: the rank's hot path writes each transition into a Float64Array (names as
// indices into a table that grows as names appear), so that reporting an op allocates nothing; a
// batch goes to the main thread as one message, which decodes it into TransitionEvents. Transitions
// that carry an error travel as objects (workers/protocol.ts), in order with these batches.
import type { TransitionEvent, WorkerMessage } from './protocol.js';

const FIELDS = 7;  // from, to, event, at, seq, op (-1: none), phases (-1: none)

export class TransitionLog {
  private data = new Float64Array(FIELDS * 64);
  private n = 0;
  private readonly ids = new Map<string, number>();
  private readonly phaseIds = new Map<readonly string[], number>();
  private count = 0;
  /** names added since the last batch: the main thread appends them to its table, in order */
  private fresh: string[] = [];

  constructor(private readonly rank: number) {}

  /** The index of `name` in the table. */
  id(name: string): number {
    let i = this.ids.get(name);
    if (i === undefined) {
      i = this.count++;
      this.ids.set(name, i);
      this.fresh.push(name);
    }
    return i;
  }

  /** A phases list (a constant array) as the index of its comma-joined name. */
  phases(p: readonly string[]): number {
    let i = this.phaseIds.get(p);
    if (i === undefined) this.phaseIds.set(p, (i = this.id(p.join(','))));
    return i;
  }

  get size(): number {
    return this.n;
  }

  push(from: number, to: number, event: number, at: number, seq: number, op: number, phases: number): void {
    if ((this.n + 1) * FIELDS > this.data.length) {
      const bigger = new Float64Array(this.data.length * 2);
      bigger.set(this.data);
      this.data = bigger;
    }
    const d = this.data, o = this.n++ * FIELDS;
    d[o] = from; d[o + 1] = to; d[o + 2] = event; d[o + 3] = at; d[o + 4] = seq; d[o + 5] = op; d[o + 6] = phases;
  }

  /** The records so far as one message (null when there are none); the log starts over. */
  take(): WorkerMessage | null {
    if (this.n === 0) return null;  // new names wait for the first record that uses them
    const m: WorkerMessage = { kind: 'transitions', rank: this.rank, names: this.fresh, data: this.data.slice(0, this.n * FIELDS) };
    this.fresh = [];
    this.n = 0;
    return m;
  }
}

/** The main thread's side: a rank's name table and the decoding of its batches. */
export class TransitionDecoder {
  private readonly names: string[] = [];

  decode(m: { rank: number; names: string[]; data: Float64Array }, emit: (t: TransitionEvent) => void): void {
    for (const n of m.names) this.names.push(n);
    const d = m.data, names = this.names;
    for (let o = 0; o < d.length; o += FIELDS) {
      const t: TransitionEvent = { rank: m.rank, from: names[d[o]!]!, to: names[d[o + 1]!]!, event: names[d[o + 2]!]!, at: d[o + 3]!, seq: d[o + 4]! };
      if (d[o + 5]! >= 0) t.op = names[d[o + 5]!];
      if (d[o + 6]! >= 0) t.phases = Object.freeze(names[d[o + 6]!]!.split(','));
      emit(t);
    }
  }
}
