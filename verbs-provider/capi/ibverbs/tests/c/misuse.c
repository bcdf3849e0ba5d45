/* Misuse through the C ABI: every feature rnic-emu does not offer must fail with the
 * errno rdma-core documents (NULL + errno, or the errno as value), never abort and never
 * succeed. Compiled against the installed rdma-core headers and run on our library.
 * Prints one line per check; exits 1 if any check failed.
 * With the argument "leak" it creates objects and exits without destroying anything. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <infiniband/verbs.h>

static int failures;

static void expect(const char *what, int ok, int err) {
    printf("%s %s (errno %d %s)\n", ok ? "ok" : "FAIL", what, err, strerror(err));
    if (!ok)
        failures++;
}

#define EXPECT_NULL(what, call, want)                                                  \
    do {                                                                               \
        errno = 0;                                                                     \
        void *p_ = (void *)(call);                                                     \
        int e_ = errno;                                                                \
        expect(what, p_ == NULL && e_ == (want), e_);                                  \
    } while (0)

#define EXPECT_VALUE(what, call, want)                                                 \
    do {                                                                               \
        errno = 0;                                                                     \
        int r_ = (call);                                                               \
        expect(what, r_ == (want) || (r_ == -1 && errno == (want)), r_ == -1 ? errno : r_); \
    } while (0)

static void on_alarm(int signal) { (void)signal; }

/* SIGALRM in `ms` milliseconds, once. */
static void alarm_in(int ms) {
    struct itimerval timer = {.it_value = {.tv_sec = 0, .tv_usec = ms * 1000}};
    setitimer(ITIMER_REAL, &timer, NULL);
}

int main(int argc, char **argv) {
    int num = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list || num != 1) {
        printf("FAIL no device\n");
        return 1;
    }
    struct ibv_context *ctx = ibv_open_device(list[0]);
    if (!ctx) {
        printf("FAIL open: %s\n", strerror(errno));
        return 1;
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    static char buffer[65536];
    struct ibv_mr *mr = ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!pd || !cq || !mr) {
        printf("FAIL basic objects: %s\n", strerror(errno));
        return 1;
    }
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    if (!qp) {
        printf("FAIL create_qp: %s\n", strerror(errno));
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "leak") == 0) {
        printf("ok leaving without destroying anything\n");
        return 0;
    }

    /* A signal ends a blocking wait for an event with EINTR, as rdma-core's read(2) does:
     * qperf's event mode leaves ibv_get_cq_event that way when its test timer fires. The
     * handler is installed without SA_RESTART, as qperf's is. */
    struct sigaction act = {.sa_handler = on_alarm};
    sigemptyset(&act.sa_mask);
    sigaction(SIGALRM, &act, NULL);
    struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
    struct ibv_cq *armed = channel ? ibv_create_cq(ctx, 16, NULL, channel, 0) : NULL;
    expect("a CQ on a completion channel, armed", armed && ibv_req_notify_cq(armed, 0) == 0, errno);
    struct ibv_cq *event_cq = NULL;
    void *event_context = NULL;
    alarm_in(100);
    EXPECT_VALUE("ibv_get_cq_event interrupted by a signal", ibv_get_cq_event(channel, &event_cq, &event_context), EINTR);
    struct ibv_async_event async;
    alarm_in(100);
    EXPECT_VALUE("ibv_get_async_event interrupted by a signal", ibv_get_async_event(ctx, &async), EINTR);
    expect("destroy the armed CQ", armed && ibv_destroy_cq(armed) == 0, errno);
    expect("destroy the channel", channel && ibv_destroy_comp_channel(channel) == 0, errno);

    /* Whatever memory the application has can be registered: stack, heap, mmap. */
    char on_stack[3000];
    struct ibv_mr *stack_mr = ibv_reg_mr(pd, on_stack + 5, sizeof on_stack - 5, IBV_ACCESS_LOCAL_WRITE);
    expect("ibv_reg_mr of stack memory at an odd address", stack_mr && stack_mr->addr == on_stack + 5, errno);
    void *mapped = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct ibv_mr *map_mr = ibv_reg_mr(pd, mapped, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    expect("ibv_reg_mr of an mmap region", map_mr != NULL, errno);
    expect("dereg stack", stack_mr && ibv_dereg_mr(stack_mr) == 0, errno);
    expect("dereg mmap", map_mr && ibv_dereg_mr(map_mr) == 0, errno);
    munmap(mapped, 1 << 20);

    EXPECT_NULL("ibv_alloc_mw", ibv_alloc_mw(pd, IBV_MW_TYPE_1), EOPNOTSUPP);
    struct ibv_xrcd_init_attr xattr = {.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1, .oflags = 0};
    EXPECT_NULL("ibv_open_xrcd", ibv_open_xrcd(ctx, &xattr), EOPNOTSUPP);
    struct ibv_qp_init_attr xrc = init;
    xrc.qp_type = IBV_QPT_XRC_SEND;
    EXPECT_NULL("ibv_create_qp XRC", ibv_create_qp(pd, &xrc), EOPNOTSUPP);
    struct ibv_qp_init_attr raw = init;
    raw.qp_type = IBV_QPT_RAW_PACKET;
    EXPECT_NULL("ibv_create_qp RAW_PACKET", ibv_create_qp(pd, &raw), EOPNOTSUPP);
    EXPECT_NULL("ibv_reg_mr ON_DEMAND", ibv_reg_mr(pd, buffer, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND), EOPNOTSUPP);
    EXPECT_NULL("ibv_reg_mr zero length", ibv_reg_mr(pd, buffer, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
    EXPECT_NULL("ibv_reg_mr remote write without local write", ibv_reg_mr(pd, buffer, 4096, IBV_ACCESS_REMOTE_WRITE), EINVAL);
    struct ibv_alloc_dm_attr dm = {.length = 4096};
    EXPECT_NULL("ibv_alloc_dm", ibv_alloc_dm(ctx, &dm), EOPNOTSUPP);
    struct ibv_flow_attr flow = {.size = sizeof flow, .port = 1};
    EXPECT_NULL("ibv_create_flow", ibv_create_flow(qp, &flow), EOPNOTSUPP);
    struct ibv_wq_init_attr wq = {.wq_type = IBV_WQT_RQ, .max_wr = 4, .max_sge = 1, .pd = pd, .cq = cq};
    EXPECT_NULL("ibv_create_wq", ibv_create_wq(ctx, &wq), EOPNOTSUPP);
    struct ibv_td_init_attr td = {0};
    EXPECT_NULL("ibv_alloc_td", ibv_alloc_td(ctx, &td), EOPNOTSUPP);
    struct ibv_cq_init_attr_ex cqx = {.cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
    EXPECT_NULL("ibv_create_cq_ex", ibv_create_cq_ex(ctx, &cqx), EOPNOTSUPP);
    struct ibv_qp_init_attr_ex qpx = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
                                      .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                      .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
                                      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    EXPECT_NULL("ibv_create_qp_ex send_ops_flags", ibv_create_qp_ex(ctx, &qpx), EOPNOTSUPP);
    union ibv_gid gid = {0};
    EXPECT_VALUE("ibv_attach_mcast", ibv_attach_mcast(qp, &gid, 0), EOPNOTSUPP);
    struct ibv_modify_cq_attr mcq = {.attr_mask = IBV_CQ_ATTR_MODERATE, .moderate = {.cq_count = 4, .cq_period = 10}};
    EXPECT_VALUE("ibv_modify_cq", ibv_modify_cq(cq, &mcq), EOPNOTSUPP);
    EXPECT_VALUE("ibv_resize_cq", ibv_resize_cq(cq, 64), EOPNOTSUPP);
    struct ibv_ah_attr ah = {.is_global = 0, .port_num = 1};
    EXPECT_NULL("ibv_create_ah without GRH", ibv_create_ah(pd, &ah), EINVAL);
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    EXPECT_VALUE("modify to INIT", ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    memset(&attr, 0, sizeof attr);
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = IBV_MTU_1024;
    attr.dest_qp_num = 2;
    attr.ah_attr.port_num = 1;
    EXPECT_VALUE("modify to RTR without GRH", ibv_modify_qp(qp, &attr,
        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), EINVAL);
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = 8, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.opcode = IBV_WR_BIND_MW, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    int r = ibv_post_send(qp, &wr, &bad);
    expect("post_send BIND_MW refused with bad_wr", r == EINVAL && bad == &wr, r);
    wr.opcode = IBV_WR_RDMA_WRITE;
    bad = NULL;
    r = ibv_post_send(qp, &wr, &bad);
    expect("post_send in INIT refused", r == EINVAL && bad == &wr, r);
    EXPECT_VALUE("destroy a CQ a QP uses", ibv_destroy_cq(cq), EBUSY);
    EXPECT_VALUE("dealloc a PD in use", ibv_dealloc_pd(pd), EBUSY);
    struct ibv_device_attr_ex dx;
    struct ibv_query_device_ex_input in = {.comp_mask = 1};
    EXPECT_VALUE("query_device_ex with input comp_mask", ibv_query_device_ex(ctx, &in, &dx), EINVAL);
    EXPECT_VALUE("query_device_ex", ibv_query_device_ex(ctx, NULL, &dx), 0);
    expect("query_device_ex reports one port", dx.orig_attr.phys_port_cnt == 1 && dx.phys_port_cnt_ex == 1, 0);

    expect("destroy qp", ibv_destroy_qp(qp) == 0, errno);
    expect("dereg mr", ibv_dereg_mr(mr) == 0, errno);
    expect("destroy cq", ibv_destroy_cq(cq) == 0, errno);
    expect("dealloc pd", ibv_dealloc_pd(pd) == 0, errno);
    expect("close", ibv_close_device(ctx) == 0, errno);
    ibv_free_device_list(list);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
