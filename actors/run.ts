// group.run: every local rank's program, and how a run ends. A program that throws, or that returns
// while its peers still run, ends the run for the others at once: the main thread raises a release in
// every rank's abort words (ops from a sequence number on end with ABORTED, whatever they wait in:
// a throw releases every op; a return after collective #S releases #S+1 on, which the returner never
// enters, so a peer finishing #S is not cut short). Once every program has ended, the ranks are put
// back in step when anything is out of step (a release, different sequence numbers, a session or
// fetches a program left behind): every rank recovers to the group's largest sequence number and
// session count, and the group is `ready` again. A rank that died (terminate, a timeout) is not a
// program's end: the run rejects with that failure as before, and the group stays failed.
//
// In a world every process's end counts (world/run-end.ts). In an elastic world the ends cross the
// run ends' exchange among the processes not lost (world/run-exchange.ts), and a rank that leaves while
// a run runs ends it with RANK_FAILED in every process; the next op re-forms the survivors first.
//
// With a signal: aborted before the run's turn (runs queue like collectives), the run is skipped;
// aborted while the programs run, every program is told (its run-abort word and an abortRun message:
// rank.aborted, rank.signal, rank.anyAborted()), and the run rejects with ABORTED once they ended.
import { abortError } from './core/abort.js';
import { RankflowError, isErrorCode } from './core/errors.js';
import { cutShort, rootCause, type Ranks } from './ranks.js';
import { rebuildThrown, thrownOf, thrownText, type ThrownValue } from './core/thrown.js';
import type { RankPosition, RunOutcome } from '../workers/protocol.js';
import type { ElasticRendezvous, Rendezvous } from './world/rendezvous.js';
import { mergeRunEnds, runEndProblem, runEndWire, type RunEnd } from './world/run-end.js';

export interface RunDeps {
  /** queues the run as a collective of the group */
  queue: <R>(body: () => Promise<R>) => Promise<R>;
  workers: Ranks;
  /** global id of this process's first rank */
  rankOffset: number;
  /** a fresh id for the run (the programs compare it with their run-abort word) */
  nextId: () => number;
  /** the group is being destroyed */
  destroying: () => boolean;
  /** a world of several processes: its connections (releases cross them; the run's end is agreed) */
  world?: () => Rendezvous | undefined;
  /** an elastic group's membership (actors/elastic.ts): what a run in a world needs of it */
  elastic?: RunMembership;
}

/** In an elastic world a run's number is its op's (the same in every process, rejected ones counted), and a rank's leaving ends it. */
export interface RunMembership {
  readonly op: number;
  /** a rank left since the survivors last re-formed */
  readonly unformed: boolean;
  readonly lastLeft?: RankflowError;
  /** calls `cb` as each rank leaves (synchronously, as this process hears of it); returns the unsubscribe */
  onLeft(cb: () => void): () => void;
}

const runId = (deps: RunDeps): number => (deps.elastic && deps.world?.() ? deps.elastic.op : deps.nextId());

export function runPrograms<T>(deps: RunDeps, url: string, args: unknown, signal?: AbortSignal): Promise<T[]> {
  if (!signal) return deps.queue(() => runOnce<T>(deps, url, args, runId(deps)));
  return new Promise<T[]>((resolve, reject) => {
    let running = 0;  // the run's id while its programs run
    let early = false;
    const onAbort = (): void => {
      if (running === 0) {
        early = true;  // skipped when its turn comes
        return reject(abortError('group.run', signal));
      }
      tellPrograms(deps.workers, running, abortError('group.run', signal).message);
    };
    signal.addEventListener('abort', onAbort, { once: true });
    deps.queue(async () => {
      if (early) throw abortError('group.run', signal);
      running = runId(deps);
      try {
        return await runOnce<T>(deps, url, args, running, signal);
      } finally {
        running = 0;
      }
    }).then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/** Tells every program of run `id` to stop (rank.aborted, rank.signal): `reason` is the signal's reason. */
function tellPrograms(workers: Ranks, id: number, reason: string): void {
  for (const m of workers.members.filter((_, r) => workers.serves(r))) {
    Atomics.store(m.runAbort, 0, id);
    void m.api.abortRun(id, reason).catch(() => {});
  }
}

async function runOnce<T>(deps: RunDeps, url: string, args: unknown, id: number, signal?: AbortSignal): Promise<T[]> {
  const { workers, rankOffset } = deps;
  const rv = deps.world?.();
  // An elastic world: a rank that leaves while the run runs (or left before the survivors re-formed) ends it.
  const elastic = rv && deps.elastic ? deps.elastic : undefined;
  let left = elastic?.unformed ?? false;
  const unleft = elastic?.onLeft(() => {
    left = true;
    (rv as ElasticRendezvous).hitRunEnds();
  });
  // An elastic group runs on the ranks that serve (a rank that left takes no part).
  const serving = workers.members.flatMap((_, r) => (workers.serves(r) ? [r] : []));
  const outcomes: Array<RunOutcome | undefined> = workers.members.map(() => undefined);
  let threw: RunEnd['threw'];
  let returned: RunEnd['returned'];
  const release = (rank: number, above: number, message: string): void => {
    workers.release(rank, BigInt(above), message);
    rv?.announceRelease({ run: id, rank, above, message });
  };
  // Another process's program ended this run for its peers: release ours too.
  const unsubscribe = rv?.onRelease((r) => {
    if (r.run === id) workers.release(r.rank, BigInt(r.above), r.message);
  });
  const ended = (r: number, o: RunOutcome): void => {
    outcomes[r] = o;
    const rank = rankOffset + r;
    if (!o.ok) {
      // Released by an ending already raised, or failed with the rank (its failure spreads as such).
      if (workers.released && o.thrown.code === 'ABORTED') return;
      if (workers.handles[r]!.error || threw) return;
      threw = { rank, at: performance.timeOrigin + performance.now(), thrown: o.thrown };
      const why = `rank ${rank}'s program ${o.thrown.isError && isErrorCode(o.thrown.code) ? 'failed' : 'threw'}: ${thrownText(o.thrown)}`;
      release(rank, 1, why);
      tellPrograms(workers, id, why);
    } else if (rv || serving.some((x) => outcomes[x] === undefined)) {
      // (in a world the other processes' programs may still run: a release that finds nobody is harmless)
      if (returned === undefined || o.seq < returned.seq) returned = { rank, seq: o.seq };
      release(rank, o.seq + 1, `rank ${rank}'s program returned after collective #${o.seq}`);
    }
  };
  try {
    const settled = await Promise.allSettled(serving.map(async (r) => {
      const m = workers.members[r]!;
      try {
        ended(r, await workers.call(r, (api) => cutShort<RunOutcome>(api.run(url, args, id), [m.untilFailed])));
      } catch (e) {
        // The rank died, or its failure ended the call: that is the run's end, not a program's.
        if (workers.handles[r]!.error || workers.handles[r]!.exited) throw e;
        // Anything else happened to the reply (its value could not be cloned): the program's failure.
        const at: RankPosition = await workers.call(r, (api) => api.position());
        ended(r, { ok: false, thrown: thrownOf(e), ...at });
      }
    }));
    failedOrDestroyed(deps, settled);
    const done = serving.map((r) => outcomes[r]!);
    const seqs = done.map((o) => o.seq);
    const local: RunEnd = {
      run: id, seq: Math.max(...seqs), sessions: Math.max(...done.map((o) => o.sessions)),
      inStep: !threw && done.every((o) => o.ok && o.state === 'ready') && seqs.every((x) => x === seqs[0]),
      mismatch: done.some((o) => !o.ok) || seqs.some((x) => x !== seqs[0]),
      ...(threw ? { threw } : {}), ...(returned ? { returned } : {}),
    };
    // In a world, every process's end counts: the same numbers and the same error everywhere.
    const end = !rv ? local : elastic ? await agreeAmongLive(rv as ElasticRendezvous, local, () => left, elastic) : await agree(rv, local, workers);
    // A rank that cannot be put back in step has failed; the program's error that began it is its cause.
    // (After a rank left, the next op's re-forming puts the ranks in step: they mask it until then.)
    if (!end.inStep && !left)
      await recover(workers, serving, end.seq, end.sessions).catch((e: RankflowError) => {
        throw end.threw ? new RankflowError(e.code, e.message, { rank: e.rank, cause: programError(end.threw.rank, end.threw.thrown) }) : e;
      });
    const t = end.threw?.thrown;
    // A program that ended with the abort it was told of (rank.signal's reason, an AbortError of a
    // timer or fetch bound to it) ended as asked: the run is ABORTED.
    if (signal?.aborted && (!t || t.code === 'ABORTED' || t.name === 'AbortError')) throw abortError('group.run', signal);
    if (end.threw) throw programError(end.threw.rank, end.threw.thrown);
    // The programs ran different collectives (a release cut some short, or they ended at different numbers).
    if (end.mismatch) throw mismatch(end.returned, done, serving.map((r) => rankOffset + r), done.find((o) => !o.ok) as Extract<RunOutcome, { ok: false }> | undefined);
    // One entry per local rank, as driver mode: null for a rank that left an elastic group.
    return outcomes.map((o) => (o ? ((o as Extract<RunOutcome, { ok: true }>).value as T) : (null as T)));
  } finally {
    // The ranks are back in step, or failed: their ops run again (or refuse with their failure).
    workers.clearReleases();
    unsubscribe?.();
    unleft?.();
  }
}

/** A rank's failure (its own, or a peer's it was told of) or the group's destroy ends the run as such. */
function failedOrDestroyed(deps: RunDeps, settled: PromiseSettledResult<unknown>[]): void {
  const { workers } = deps;
  const errors = [
    ...settled.flatMap((s) => (s.status === 'rejected' ? [RankflowError.from(s.reason)] : [])),
    ...workers.handles.flatMap((h, r) => (h.error && workers.serves(r) ? [h.error] : [])),
  ];
  if (errors.length === 0 && !deps.destroying()) return;
  if (deps.destroying()) throw new RankflowError('ABORTED', 'group.run: the group was destroyed while its programs ran', { ...(errors[0] ? { cause: errors[0] } : {}) });
  throw rootCause(errors);
}

/** Every process's RunEnd, checked and merged; a rank's failure meanwhile ends the wait. */
async function agree(rv: Rendezvous, local: RunEnd, workers: Ranks): Promise<RunEnd> {
  return merged(rv, local.run, await cutShort(rv.exchange<RunEnd>(runEndWire(local)), workers.members.map((m) => m.untilFailed)));
}

/**
 * An elastic world's: the RunEnds of the processes not lost (world/run-exchange.ts). A rank that left
 * while the run ran ends it with RANK_FAILED in every process: this one, knowing it already, gives
 * nothing; otherwise the leader's word decides (it cuts the exchange once any process heard of one).
 */
async function agreeAmongLive(rv: ElasticRendezvous, local: RunEnd, left: () => boolean, m: RunMembership): Promise<RunEnd> {
  const ends = left() ? undefined : await rv.exchangeRunEnd(local.run, runEndWire(local));
  if (ends === undefined) {
    const e = m.lastLeft;
    throw new RankflowError('RANK_FAILED', `group.run: ${e?.rank !== undefined ? `rank ${e.rank}` : 'a rank'} left the group while this run ran` +
      `${e ? ` (${e.message})` : ''}: it ended in every process; the next op runs among the ranks that serve`, { ...(e?.rank !== undefined ? { rank: e.rank } : {}), ...(e ? { cause: e } : {}) });
  }
  return merged(rv, local.run, ends, true);
}

/** The ends of run `run`, each checked (among the live: null for a process lost before it), merged. */
function merged(rv: Rendezvous, run: number, ends: unknown[], amongLive = false): RunEnd {
  const given = amongLive ? ends.filter((e) => e !== null) : ends;
  ends.forEach((e, i) => {
    const problem = amongLive && e === null ? undefined : runEndProblem(e, run, rv.peers[i]!);
    if (problem) throw new RankflowError('STATE', `group.run: the process of ranks ${rv.peers[i]!.rankOffset}.. sent an invalid end of run ${run}: ${problem}`);
  });
  return mergeRunEnds(given as RunEnd[]);
}

/** Every rank recovers to the group's numbers (the largest any rank used); a rank that cannot has failed. */
async function recover(workers: Ranks, serving: number[], seq: number, sessions: number): Promise<void> {
  const settled = await Promise.allSettled(serving.map((r) => workers.call(r, (api) => api.recover(seq, sessions))));
  const errors = settled.flatMap((s) => (s.status === 'rejected' ? [RankflowError.from(s.reason)] : []));
  if (errors.length > 0) throw rootCause(errors);
}

/**
 * The run's error when a program threw: its code where it threw one of rankflow's errors (a
 * RankflowError, or an error of the addon's, which carries the code too), else PROGRAM_ERROR; what it
 * threw is the cause.
 */
function programError(rank: number, t: ThrownValue): RankflowError {
  const own = t.isError && isErrorCode(t.code);
  return new RankflowError(own ? t.code as never : 'PROGRAM_ERROR', `rank ${rank}'s program ${own ? 'failed' : 'threw'}: ${thrownText(t)}`, {
    rank, cause: rebuildThrown(t), ...(t.phase !== undefined ? { phase: t.phase } : {}),
  });
}

/** The run's error when the programs ran different collectives: the earliest return named, a released rank's error the cause. */
function mismatch(returned: RunEnd['returned'], done: RunOutcome[], ranks: number[], cut?: Extract<RunOutcome, { ok: false }>): RankflowError {
  const seqs = done.map((o, i) => `rank ${ranks[i]}: #${o.seq}`).join(', ');
  const first = returned ? `rank ${returned.rank}'s program returned after collective #${returned.seq} while its peers went on` : 'the ranks\' programs ran different numbers of collectives';
  return new RankflowError('STATE', `group.run: ${first} (last collectives ${seqs}): every rank's program must run the same collectives`, {
    ...(returned ? { rank: returned.rank } : {}), ...(cut ? { cause: rebuildThrown(cut.thrown) } : {}),
  });
}
