// Errors that cross the comlink port keep their RankflowError fields. comlink's own 'throw' handler
// sends only { message, name, stack }, so a worker's TIMEOUT_CPU or RANK_FAILED would arrive on the
// main thread as a bare Error (and RankflowError.from would call it EINVAL). Installed on both
// sides: the worker serializes with it, the main thread deserializes with it.
import * as Comlink from 'comlink/dist/esm/comlink.mjs';

import { RankflowError } from './errors.js';

interface SerializedThrow {
  isError: boolean;
  value: unknown;
}

let installed = false;

export function installErrorTransfer(): void {
  if (installed) return;
  installed = true;
  const base = Comlink.transferHandlers.get('throw') as Comlink.TransferHandler<unknown, SerializedThrow>;
  Comlink.transferHandlers.set('throw', {
    canHandle: (v: unknown): v is unknown => base.canHandle(v),
    serialize(thrown: unknown) {
      const { value } = thrown as { value: unknown };
      if (!(value instanceof Error)) return base.serialize(thrown);
      const e = value as Error & { code?: unknown; rank?: unknown; state?: unknown; phase?: unknown };
      const fields = { message: e.message, name: e.name, stack: e.stack, code: e.code, rank: e.rank, state: e.state, phase: e.phase };
      return [{ isError: true, value: fields }, []];
    },
    deserialize(s: SerializedThrow) {
      const v = s.value as { code?: unknown; message?: string; stack?: string } | undefined;
      if (s.isError && typeof v?.code === 'string') {
        const e = RankflowError.from(v);
        if (v.stack) e.stack = v.stack;
        throw e;
      }
      return base.deserialize(s);
    },
  } as Comlink.TransferHandler<unknown, SerializedThrow>);
}
