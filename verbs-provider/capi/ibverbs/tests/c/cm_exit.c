/* A connection whose server process exits without disconnecting or destroying anything.
 * On Linux the kernel then destroys the process's CM ids and sends a DREQ, so the client
 * sees RDMA_CM_EVENT_DISCONNECTED at once instead of never.
 *
 *   cm_exit server ADDRESS PORT    accepts one connection, then exit(0)
 *   cm_exit client ADDRESS PORT    connects, then waits at most 30 s for DISCONNECTED
 *
 * Prints what happened; exits 0 when its side did what it should. */
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *next_event(struct rdma_event_channel *channel, int timeout_ms) {
    struct pollfd pfd = {.fd = channel->fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) != 1)
        return NULL;
    struct rdma_cm_event *event = NULL;
    if (rdma_get_cm_event(channel, &event))
        return NULL;
    return event;
}

static int expect(struct rdma_event_channel *channel, enum rdma_cm_event_type type, int timeout_ms,
                  struct rdma_cm_id **id) {
    struct rdma_cm_event *event = next_event(channel, timeout_ms);
    if (!event) {
        printf("no %s within %d ms\n", rdma_event_str(type), timeout_ms);
        return -1;
    }
    int ok = event->event == type && event->status == 0;
    printf("%s (status %d)\n", rdma_event_str(event->event), event->status);
    if (id)
        *id = event->id;
    rdma_ack_cm_event(event);
    return ok ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    int server = strcmp(argv[1], "server") == 0;
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &address.sin_addr);
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *id = NULL;
    if (!channel || rdma_create_id(channel, &id, NULL, RDMA_PS_TCP))
        return 1;
    struct ibv_qp_init_attr attr = {
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct rdma_conn_param param = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7};
    if (server) {
        struct rdma_cm_id *child = NULL;
        if (rdma_bind_addr(id, (struct sockaddr *)&address) || rdma_listen(id, 1))
            return 1;
        printf("listening\n");
        fflush(stdout);
        if (expect(channel, RDMA_CM_EVENT_CONNECT_REQUEST, 60000, &child) || rdma_create_qp(child, NULL, &attr) ||
            rdma_accept(child, &param) || expect(channel, RDMA_CM_EVENT_ESTABLISHED, 30000, NULL))
            return 1;
        printf("exiting with the connection up\n");
        exit(0);
    }
    if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&address, 5000) ||
        expect(channel, RDMA_CM_EVENT_ADDR_RESOLVED, 10000, NULL) || rdma_resolve_route(id, 5000) ||
        expect(channel, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000, NULL) || rdma_create_qp(id, NULL, &attr) ||
        rdma_connect(id, &param) || expect(channel, RDMA_CM_EVENT_ESTABLISHED, 30000, NULL))
        return 1;
    if (expect(channel, RDMA_CM_EVENT_DISCONNECTED, 30000, NULL))
        return 1;
    rdma_disconnect(id);
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(channel);
    printf("client done\n");
    return 0;
}
