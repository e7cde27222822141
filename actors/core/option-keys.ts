// Unknown option keys (API.md, Errors): a key no option of that object is named is EINVAL naming it,
// with the nearest known name when one is close ("did you mean 'ranks'?"), at every level of
// createGroup's options and in the ops' option objects. A typo must not silently become a default.
import { invalid, type RankflowError } from './errors.js';

/**
 * The keys of an options type, each named once: `keysOf<GroupOptions>()(['ranks', ...])` does not
 * compile when a key of the type is missing from the list or the list names one it does not have, so
 * an option added to the type cannot be forgotten here.
 */
export const keysOf = <T>() =>
  <const K extends ReadonlyArray<keyof T>>(keys: K & ([Exclude<keyof T, K[number]>] extends [never] ? unknown : { missing: Exclude<keyof T, K[number]> })): readonly string[] =>
    keys as unknown as readonly string[];

/** Edit distance (insertions, deletions, substitutions, adjacent swaps), case-insensitive. */
function distance(a: string, b: string): number {
  a = a.toLowerCase();
  b = b.toLowerCase();
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0]![j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

/**
 * The known name `word` most likely meant: the closest by edit distance within a third of its length
 * (at least 2), or one that starts with it or it starts with ('maxTokens' -> 'maxTokensPerRank').
 */
export function nearestName(word: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const k of known) {
    const dist = distance(word, k);
    if (dist < bestDistance) [best, bestDistance] = [k, dist];
  }
  if (best !== undefined && bestDistance <= Math.max(2, Math.floor(word.length / 3))) return best;
  const lower = word.toLowerCase();
  return word.length >= 3 ? known.find((k) => k.toLowerCase().startsWith(lower) || lower.startsWith(k.toLowerCase())) : undefined;
}

/**
 * The EINVAL for the first key of `v` that is not in `known` (naming it as `${name}.${key}`, the nearest
 * known name, and every name `name` takes), or undefined. Own enumerable string keys (what a literal
 * or a spread sets). No allocation when every key is known: rank programs' device ops call it per op.
 */
export function unknownKeyError(name: string, v: object, known: readonly string[]): RankflowError | undefined {
  for (const key in v) {
    if (!Object.hasOwn(v, key) || known.includes(key)) continue;
    const near = nearestName(key, known);
    return invalid(`${name}.${key}`, `is not an option${near !== undefined ? ` (did you mean '${near}'?)` : ''}; ${name} takes ${known.join(', ')}`);
  }
  return undefined;
}

/** Throws unknownKeyError's error, if any. */
export function checkKnownKeys(name: string, v: object, known: readonly string[]): void {
  const error = unknownKeyError(name, v, known);
  if (error) throw error;
}

/**
 * The keys an options shape names, as error messages show it ('{ withCpuSync? }', '{ maxBytes,
 * maxAllGathers }'); undefined for an open shape ('{ buffer, ranks?, ... }'), whose keys are listed
 * elsewhere. So a check written as checkOptions(name, v, '{ withCpuSync? }') refuses unknown keys too,
 * and its message and its check cannot disagree.
 */
export function shapeKeys(shape: string): readonly string[] | undefined {
  const inner = /^\{(.*)\}$/.exec(shape.trim())?.[1];
  if (inner === undefined || inner.includes('...') || /[{}:]/.test(inner)) return undefined;
  const keys = inner.split(',').map((k) => k.trim().replace(/\?$/, ''));
  return keys.every((k) => /^[A-Za-z_$][\w$]*$/.test(k)) ? keys : undefined;
}
