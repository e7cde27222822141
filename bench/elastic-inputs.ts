// What the elastic benches share (bench/elastic.ts, one process; bench/elastic-world.ts, a world):
// the driver-mode dispatch shape and its seeded inputs, the group's buffer for it, and the
// percentiles they report.
import { tensor, type DispatchInput } from '../actors/index.js';

export const SHAPE = { tokens: 64, hidden: 2048, topk: 4 };

export const pct = (xs: number[], p: number): number => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;
export const median = (xs: number[]): number => pct(xs, 50);
export const stats = (xs: number[]) => ({ p50: pct(xs, 50), p99: pct(xs, 99), max: Math.max(...xs), n: xs.length });
export const buffer = (W: number) => ({ maxTokensPerRank: SHAPE.tokens, hidden: SHAPE.hidden, topk: SHAPE.topk, numExperts: 8 * W });

/** Rank r's driver-mode dispatch input in a world of W ranks (seeded by r). */
export function input(W: number, r: number): DispatchInput<'bf16'> {
  const { tokens: T, hidden: H, topk: K } = SHAPE;
  const data = new Uint16Array(T * H).map((_, i) => 0x3f80 + ((i * 31 + r) % 97));
  const topkIdx = Int32Array.from({ length: T * K }, (_, i) => (Math.floor(i / K) * 5 + (i % K) * 3 + r) % (8 * W));
  return { x: tensor('bf16', [T, H], data), topkIdx, topkWeights: new Float32Array(T * K).fill(0.25) };
}
