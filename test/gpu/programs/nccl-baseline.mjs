// Rank program: the NCCL all-to-all baseline (a collective of every rank).
export default async function (rank) {
  return rank.benchAlltoAll(1 << 20, 2, 1);
}
