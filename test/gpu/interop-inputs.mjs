// The per-row factors of test/gpu/interop.test.mjs, shared by the test (its host reference) and its
// rank program: functions of a received row's source rank and token, exact in fp32, some of them
// changing the bf16 rounding.
export const factorA = (srcRank, srcToken) => 0.5 + ((srcRank * 7 + srcToken) % 4) * 0.25;
export const factorB = (srcToken) => 2 - (srcToken % 3) * 0.5;

/** Per-row factors of a dispatch's received rows. */
export const factors = (f, srcRank, srcToken) => Float32Array.from(srcToken, (t, i) => f(srcRank[i], t));
