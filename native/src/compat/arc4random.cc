// arc4random for the prebuilt addons, which link libstdc++ statically (RF_STATIC_RUNTIME in
// native/CMakeLists.txt): g++ 12's libstdc++.a, built against glibc 2.36, calls arc4random from
// std::random_device, and the std exception types pull that object in. Defined here (hidden, so the
// static link binds it and no GLIBC_2.36 symbol is asked for), a prebuilt addon loads on glibc 2.34
// (Ubuntu 22.04, RHEL 9, Amazon Linux 2023) instead of only on 2.36. rankflow itself never makes a
// random_device; the definition is a full one all the same, with glibc's semantics: getrandom, else
// /dev/urandom, and like glibc's it does not return without randomness.
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>

extern "C" __attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t value = 0;
  for (;;) {
    const ssize_t n = getrandom(&value, sizeof value, 0);
    if (n == ssize_t(sizeof value)) return value;
    if (n < 0 && errno == EINTR) continue;
    break;  // ENOSYS (a kernel older than 3.17): the device below
  }
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t got = 0;
    while (got < ssize_t(sizeof value)) {
      const ssize_t n = read(fd, reinterpret_cast<char*>(&value) + got, sizeof value - size_t(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += n;
    }
    close(fd);
    if (got == ssize_t(sizeof value)) return value;
  }
  abort();  // glibc's arc4random ends the process here too ("cannot get entropy")
}
