/* tgtd's iSER portals: one listening id per wildcard address of the port (0.0.0.0 and ::),
 * each made family-only with RDMA_OPTION_ID_AFONLY before its bind. On Linux both bind and
 * listen; an IPv6 wildcard that is not family-only overlaps the IPv4 one instead and its
 * bind fails with EADDRNOTAVAIL (rdma_cm's port rules, net.ipv6.bindv6only = 0).
 *
 *   cm_portals PORT
 *
 * Prints each step; exits 0 when every step did what Linux does. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static int step(const char *what, int result, int expected_errno) {
    int error = result ? errno : 0;
    printf("%s: %s\n", what, error ? strerror(error) : "ok");
    return error == expected_errno ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    int port = atoi(argv[1]);
    struct sockaddr_in any4 = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct sockaddr_in6 any6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    int afonly = 1, failed = 0;
    struct rdma_event_channel *channel = rdma_create_event_channel();
    struct rdma_cm_id *v4 = NULL, *shared6 = NULL, *v6 = NULL;
    if (!channel || rdma_create_id(channel, &v4, NULL, RDMA_PS_TCP) ||
        rdma_create_id(channel, &shared6, NULL, RDMA_PS_TCP) || rdma_create_id(channel, &v6, NULL, RDMA_PS_TCP))
        return 1;
    failed |= step("bind 0.0.0.0 family-only", rdma_set_option(v4, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &afonly,
                                                               sizeof(afonly)), 0);
    failed |= step("bind 0.0.0.0", rdma_bind_addr(v4, (struct sockaddr *)&any4), 0);
    failed |= step("listen 0.0.0.0", rdma_listen(v4, 0), 0);
    failed |= step("bind :: (not family-only)", rdma_bind_addr(shared6, (struct sockaddr *)&any6), EADDRNOTAVAIL);
    failed |= step("bind :: family-only", rdma_set_option(v6, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &afonly,
                                                          sizeof(afonly)), 0);
    failed |= step("bind ::", rdma_bind_addr(v6, (struct sockaddr *)&any6), 0);
    failed |= step("listen ::", rdma_listen(v6, 0), 0);
    rdma_destroy_id(v6);
    rdma_destroy_id(shared6);
    rdma_destroy_id(v4);
    rdma_destroy_event_channel(channel);
    printf(failed ? "portals: FAILED\n" : "portals: both wildcards listen\n");
    return failed ? 1 : 0;
}
