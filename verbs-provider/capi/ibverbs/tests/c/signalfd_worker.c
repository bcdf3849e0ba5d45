/* tgtd's backing-store completions: after the RDMA device is open and a CM id is bound
 * (so the libraries' own threads run), the main thread blocks SIGUSR2 and reads it from a
 * signalfd; a worker thread that blocks every signal sends kill(getpid(), SIGUSR2) per
 * finished I/O. The signal must reach the signalfd: a library thread that left SIGUSR2
 * unblocked would take it instead, with its default action, ending the process.
 *
 *   signalfd_worker ROUNDS
 *
 * Prints "signalfd: ROUNDS of ROUNDS signals read" and exits 0 when all arrived. */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static void *worker(void *arg) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    kill(getpid(), SIGUSR2);
    return arg;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    int rounds = atoi(argv[1]), got = 0;
    int devices = 0;
    struct ibv_device **list = ibv_get_device_list(&devices);
    if (!list || devices < 1) {
        printf("no device\n");
        return 1;
    }
    struct ibv_context *context = ibv_open_device(list[0]);
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *id = NULL;
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(3261)};
    if (!context || !channel || rdma_create_id(channel, &id, NULL, RDMA_PS_TCP) ||
        rdma_bind_addr(id, (struct sockaddr *)&any) || rdma_listen(id, 1)) {
        printf("setup failed\n");
        return 1;
    }
    /* As tgtd's bs_init_signalfd: blocked in the main thread after the libraries started. */
    sigset_t usr2;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    sigprocmask(SIG_BLOCK, &usr2, NULL);
    int fd = signalfd(-1, &usr2, SFD_NONBLOCK);
    for (int i = 0; i < rounds; i++) {
        pthread_t thread;
        pthread_create(&thread, NULL, worker, NULL);
        pthread_join(thread, NULL);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        struct signalfd_siginfo info;
        if (poll(&p, 1, 2000) == 1 && read(fd, &info, sizeof(info)) == sizeof(info) &&
            info.ssi_signo == SIGUSR2)
            got++;
    }
    printf("signalfd: %d of %d signals read\n", got, rounds);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(channel);
    ibv_close_device(context);
    ibv_free_device_list(list);
    return got == rounds ? 0 : 1;
}
