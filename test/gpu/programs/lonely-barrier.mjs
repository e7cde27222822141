// Rank program for the GPU timeout test: rank 0 enters a barrier that rank 1 never enters.
export default async function (rank) {
  if (rank.rank === 0) await rank.barrier();
  return rank.rank;
}
