/*
 * kama-listen-first: listen on the runtime's probe port, then exec the runtime.
 *
 * Why it exists: the kubelet probes a new container's readiness a few milliseconds
 * after the container starts, and a probe that finds the port closed is refused; the
 * next one comes a probe period (1 s) later. `kama runtime` is Python and cannot
 * listen sooner than about 50 ms after its start, so most serving pods waited that
 * second (bench_scale_out, README "Performance"). This program is the container's
 * first process: it listens in its first millisecond, so the kubelet's first probe
 * waits in the socket's backlog until the runtime, exec'd in its place with the
 * socket, answers it (held until llama-server has loaded, within the probe's
 * timeout).
 *
 * The socket is handed over as systemd's socket activation does (sd_listen_fds(3)):
 * file descriptor 3, LISTEN_FDS=1, LISTEN_PID the process's own (exec keeps it).
 * KAMA_LISTEN_FIRST=<port> asks for it, on the address in POD_IP (the downward
 * API). Without them, or when listening fails, it execs the command as it is and the
 * runtime listens itself, as before.
 *
 * Usage: kama-listen-first COMMAND [ARG...]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FIRST_LISTEN_FD 3 /* SD_LISTEN_FDS_START */
#define BACKLOG 64        /* runtime/probe_socket.py's */

/* The port in `text`, or 0 when it is not one. */
static int parse_port(const char *text) {
    char *end = NULL;
    long port = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || port < 1 || port > 65535) {
        return 0;
    }
    return (int)port;
}

/* A TCP socket listening on host:port, as file descriptor 3 (not close-on-exec);
 * -1 when it cannot be. */
static int listen_on(const char *host, int port) {
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    struct sockaddr *address;
    socklen_t length;
    int family;
    memset(&v4, 0, sizeof v4);
    memset(&v6, 0, sizeof v6);
    if (inet_pton(AF_INET, host, &v4.sin_addr) == 1) {
        v4.sin_family = AF_INET;
        v4.sin_port = htons((unsigned short)port);
        family = AF_INET, address = (struct sockaddr *)&v4, length = sizeof v4;
    } else if (inet_pton(AF_INET6, host, &v6.sin6_addr) == 1) {
        v6.sin6_family = AF_INET6;
        v6.sin6_port = htons((unsigned short)port);
        family = AF_INET6, address = (struct sockaddr *)&v6, length = sizeof v6;
    } else {
        return -1;
    }
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0) {
        return -1;
    }
    int on = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        bind(fd, address, length) != 0 || listen(fd, BACKLOG) != 0) {
        close(fd);
        return -1;
    }
    if (fd != FIRST_LISTEN_FD) {
        if (dup2(fd, FIRST_LISTEN_FD) < 0) {
            close(fd);
            return -1;
        }
        close(fd);
    }
    return FIRST_LISTEN_FD;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s COMMAND [ARG...]\n", argv[0]);
        return 2;
    }
    const char *port_text = getenv("KAMA_LISTEN_FIRST");
    const char *host = getenv("POD_IP");
    if (port_text != NULL) {
        int port = parse_port(port_text);
        if (port != 0 && host != NULL && listen_on(host, port) == FIRST_LISTEN_FD) {
            char pid[24];
            snprintf(pid, sizeof pid, "%ld", (long)getpid());
            setenv("LISTEN_FDS", "1", 1);
            setenv("LISTEN_PID", pid, 1);
        } else {
            fprintf(stderr, "kama-listen-first: cannot listen on %s port %s; the command will\n",
                    host != NULL ? host : "(no POD_IP)", port_text);
        }
        unsetenv("KAMA_LISTEN_FIRST");
    }
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
