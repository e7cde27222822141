// Comlink sends a thrown Error across threads as { message, name, stack } only, so a rank's
// RankflowError reached the main thread without its code (and RankflowError.from made it EINVAL).
// The worker's 'throw' handler now also carries code, rank, state and phase; comlink's own
// deserializer copies every field onto the Error it rethrows.
import * as Comlink from 'comlink/dist/esm/comlink.mjs';

type Serialized = { isError: boolean; value: Record<string, unknown> };
type ThrowHandler = Comlink.TransferHandler<{ value: unknown }, Serialized>;

const original = Comlink.transferHandlers.get('throw') as unknown as ThrowHandler;
Comlink.transferHandlers.set('throw', {
  canHandle: original.canHandle,
  serialize(thrown: { value: unknown }): [Serialized, unknown[]] {
    const [out, transfers] = original.serialize(thrown);
    const e = thrown.value as { code?: unknown; rank?: unknown; state?: unknown; phase?: unknown } | null;
    if (out.isError && e !== null && typeof e === 'object') {
      for (const key of ['code', 'rank', 'state', 'phase'] as const) if (e[key] !== undefined) out.value[key] = e[key];
    }
    return [out, transfers];
  },
  deserialize: original.deserialize,
} as unknown as Comlink.TransferHandler<unknown, unknown>);
