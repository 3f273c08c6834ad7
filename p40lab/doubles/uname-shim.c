/* p40lab: the running kernel's release as a lab host sees it (uname(2), so `uname -r`, kmod's
 * modinfo/depmod/modprobe and Python's os.uname() agree). A lab host shares the controller's
 * kernel; the lab boots it "into" the release named in /run/p40lab-sim/kernel-release (written
 * at every boot by p40lab.boot: the kernel the host's /boot says it boots). Loaded into every
 * process of the host through /etc/ld.so.preload. Without that file: the real answer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

int uname(struct utsname *buf) {
    static int (*real)(struct utsname *);
    if (!real)
        real = (int (*)(struct utsname *))dlsym(RTLD_NEXT, "uname");
    if (!real)
        return -1;
    int rc = real(buf);
    if (rc != 0)
        return rc;
    int fd = open("/run/p40lab-sim/kernel-release", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rc;
    char release[sizeof buf->release];
    ssize_t n = read(fd, release, sizeof release - 1);
    close(fd);
    while (n > 0 && (release[n - 1] == '\n' || release[n - 1] == ' '))
        n--;
    if (n > 0) {
        release[n] = '\0';
        memcpy(buf->release, release, (size_t)n + 1);
    }
    return rc;
}
