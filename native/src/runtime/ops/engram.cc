// engram: a table in every rank's host segment, fetched by global row id (entry g lives on rank
// floor(g / entriesPerRank), row g % entriesPerRank). Across nodes a rank fetches its node's entries only.
#include "../ops.hpp"

namespace rankflow::ops {

void engram_write(Context& c, Mem table, int64_t entries, int64_t row_bytes) {
  c.backend().check_runs("engramWrite");
  RF_CHECK(!c.session.open, "STATE", "engramWrite inside an AGRS session: close() the session first");
  const int fetches = c.inflight.count(InFlightKind::Fetch);
  RF_CHECK(fetches == 0, "STATE",
           "engramWrite while " + std::to_string(fetches) +
               " engram fetch(es) are in flight (they read the table it replaces): wait() for them first");
  RF_CHECK(entries >= 0 && row_bytes > 0, "EINVAL", "engramWrite: the table needs [entries, hidden] with hidden > 0");
  RF_CHECK(c.cpu_bytes > 0, "EINVAL",
           "engramWrite needs a host segment: create the group with buffer.cpuBytes >= " +
               std::to_string(entries * row_bytes) + " (engramSizeHint)");
  RF_CHECK(entries * row_bytes <= c.cpu_bytes, "EINVAL",
           "engram table of " + std::to_string(entries * row_bytes) + " bytes does not fit buffer.cpuBytes (" +
               std::to_string(c.cpu_bytes) + "); needs " + std::to_string(entries * row_bytes));
  c.backend().check_alive("engramWrite");
  c.backend().engram_write(c.next_seq(), table, entries * row_bytes);
  c.engram_entries = entries;
  c.engram_row_bytes = row_bytes;
}

void check_engram_ids(const Context& c, const int32_t* ids, int64_t n) {
  const int64_t total = c.engram_entries * c.world();
  const Nodes& nd = c.nodes;
  for (int64_t i = 0; i < n; ++i) {
    RF_CHECK(ids[i] >= 0 && ids[i] < total, "EINVAL",
             "indices[" + std::to_string(i) + "] = " + std::to_string(ids[i]) + " is outside [0, " + std::to_string(total) + ")");
    // Across nodes a rank maps only its node's host segments (both backends).
    const int owner = int(ids[i] / c.engram_entries);
    RF_CHECK(!nd.two_level() || nd.same_node(owner), "EINVAL",
             "indices[" + std::to_string(i) + "]: entry " + std::to_string(ids[i]) + " lives on rank " + std::to_string(owner) +
                 ", on node " + std::to_string(nd.node_of(owner)) + ": reading another node's host segment is an RDMA read, " +
                 "which rankflow's scale-out leg does not do; fetch entries of this node's ranks (" +
                 std::to_string(nd.first_local() * c.engram_entries) + " to " +
                 std::to_string((nd.first_local() + nd.ranks_per_node) * c.engram_entries - 1) + ")");
  }
}

void engram_fetch(Context& c, const int32_t* ids, int64_t n, Mem out) {
  c.backend().check_runs("engramFetch");
  RF_CHECK(!c.session.open, "STATE", "engramFetch inside an AGRS session: close() the session first");
  RF_CHECK(c.engram_entries >= 0, "STATE", "engramFetch before engramWrite: no table is stored");
  check_engram_ids(c, ids, n);
  c.backend().check_alive("engramFetch");
  c.next_seq();
  c.backend().engram_fetch(Mem{const_cast<int32_t*>(ids), false}, n, c.engram_entries, c.engram_row_bytes, out);
}

}  // namespace rankflow::ops
