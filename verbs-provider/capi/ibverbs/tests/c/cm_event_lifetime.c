/* The lifetime of an id's events, as librdmacm keeps it. rping's client relies on it: its
 * CM thread may be handling DISCONNECTED while the main thread destroys the id and frees
 * the id's context.
 *   1. An event of an id destroyed before the application took it is never handed out
 *      (the kernel drops it): no event carries an id, or a context, that was freed.
 *   2. rdma_destroy_id returns only after the id's event that another thread holds has
 *      been acknowledged, and that thread still sees the id and its context.
 *
 *   cm_event_lifetime ADDRESS     (the device's own IPv4 address, resolved as the peer)
 *
 * Prints each check; exits 0 when all hold. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

struct holder {
    struct rdma_cm_event *event;
    void *expected_context;
    int context_seen;
    double acknowledged_at;
};

/* Holds the event a while, as an application's CM thread handling it would, then acks it. */
static void *hold_then_acknowledge(void *argument) {
    struct holder *holder = argument;
    usleep(300 * 1000);
    holder->context_seen = holder->event->id->context == holder->expected_context;
    holder->acknowledged_at = now();
    rdma_ack_cm_event(holder->event);
    return NULL;
}

static void set_blocking(int fd, int blocking) {
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, blocking ? flags & ~O_NONBLOCK : flags | O_NONBLOCK);
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    struct sockaddr_in peer = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1)
        return 2;
    static int context;
    int failed = 0;
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *id = NULL;
    if (!channel || rdma_create_id(channel, &id, &context, RDMA_PS_TCP) ||
        rdma_resolve_addr(id, NULL, (struct sockaddr *)&peer, 2000)) {
        printf("FAIL setup: %s\n", strerror(errno));
        return 1;
    }

    /* 1. The resolution's event is queued by now; the id goes before anyone takes it. */
    usleep(300 * 1000);
    if (rdma_destroy_id(id)) {
        printf("FAIL rdma_destroy_id: %s\n", strerror(errno));
        return 1;
    }
    set_blocking(channel->fd, 0);
    struct rdma_cm_event *event = NULL;
    if (rdma_get_cm_event(channel, &event) == 0) {
        printf("FAIL an event (%s) of the destroyed id was handed out, with context %p\n",
               rdma_event_str(event->event), event->id->context);
        failed = 1;
    } else {
        printf("ok no event of a destroyed id is handed out (%s)\n", strerror(errno));
    }
    set_blocking(channel->fd, 1);

    /* 2. Another thread holds the id's event while this one destroys the id. */
    if (rdma_create_id(channel, &id, &context, RDMA_PS_TCP) ||
        rdma_resolve_addr(id, NULL, (struct sockaddr *)&peer, 2000) || rdma_get_cm_event(channel, &event)) {
        printf("FAIL second id: %s\n", strerror(errno));
        return 1;
    }
    struct holder holder = {.event = event, .expected_context = &context};
    pthread_t thread;
    pthread_create(&thread, NULL, hold_then_acknowledge, &holder);
    usleep(50 * 1000);
    rdma_destroy_id(id);
    double destroyed_at = now();
    pthread_join(thread, NULL);
    if (destroyed_at < holder.acknowledged_at) {
        printf("FAIL rdma_destroy_id returned %.0f ms before the event was acknowledged\n",
               (holder.acknowledged_at - destroyed_at) * 1e3);
        failed = 1;
    } else {
        printf("ok rdma_destroy_id waited for the event's acknowledgement\n");
    }
    if (!holder.context_seen) {
        printf("FAIL the held event's id lost its context\n");
        failed = 1;
    }
    rdma_destroy_event_channel(channel);
    printf(failed ? "event lifetime: FAILED\n" : "event lifetime: as librdmacm\n");
    return failed;
}
