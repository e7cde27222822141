// Rank program of test/gpu/elastic.test.mjs: rank `who` enters a barrier alone while the others do
// nothing for `holdMs` (longer than the group's gpuSeconds): its device wait times out (TIMEOUT_GPU),
// the rank leaves, and the others, idle meanwhile, go on without it.
export default async function elasticStall(rank, { who, holdMs }) {
  if (rank.rank === who) {
    await rank.barrier();
    return 'passed';
  }
  await new Promise((r) => setTimeout(r, holdMs));
  return 'held';
}
