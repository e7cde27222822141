// Which processes can share memory handles: an id equal in two processes exactly when one can
// pass fds to the other over an abstract Unix socket and map them.
import { readFileSync, readlinkSync } from 'node:fs';
import os from 'node:os';

function readOr(read: () => string, fallback: string): string {
  try {
    return read().trim();
  } catch {
    return fallback;
  }
}

/**
 * `hostname/boot_id/netns/pidns`. The boot id tells two machines (or two boots) with the same
 * hostname apart; the network namespace is there because abstract Unix socket names are scoped to
 * it, so two containers of one machine that do not share it cannot pass fds that way; the pid
 * namespace because the fd server serves only the pids of the world's table (fdpass.cc), which
 * are the pids it sees only when both processes see the same ones.
 */
export function hostId(): string {
  const bootId = readOr(() => readFileSync('/proc/sys/kernel/random/boot_id', 'utf8'), 'no-boot-id');
  const netns = readOr(() => readlinkSync('/proc/self/ns/net'), 'no-netns');
  const pidns = readOr(() => readlinkSync('/proc/self/ns/pid'), 'no-pidns');
  return `${os.hostname()}/${bootId}/${netns}/${pidns}`;
}
