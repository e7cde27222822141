// Rank program for the GPU timeout test: rank 0 enters a barrier that the other ranks never enter;
// their programs never end either (a program that returned would release rank 0 at once: that is
// test/gpu/release.test.mjs), so only the kernel's own timeout ends rank 0's wait.
export default async function (rank) {
  if (rank.rank === 0) await rank.barrier();
  else await new Promise(() => {});
  return rank.rank;
}
