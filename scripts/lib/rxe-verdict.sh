# shellcheck shell=bash
# Sourced by scripts/rxe-interop: the rxe side's own verdict on a case, beyond its exit
# status, from what perftest or ibv_rc_pingpong printed.
#
#   rxe_output_ok CASE ROLE SIZE ITERS OUTPUT    (ROLE: server or client, for the record:
#                                                 both sides are held to the same rules)
#
# Succeeds only when OUTPUT shows the run that was asked for and no error:
# * no line perftest or rc_pingpong prints when something failed ("Couldn't ...",
#   "Failed ...", "Unable ...", "error", "invalid data", a completion with a bad status);
# * perftest: its result row (the line under "#bytes #iterations ...") with #bytes = SIZE
#   and #iterations = ITERS; perftest 4.5's programs print it on both sides (a BW server
#   reports what it received or the client's figures, ib_write_lat's server its own
#   latencies), as seen against rdma_rxe;
# * rc_pingpong: "2*SIZE*ITERS bytes in" and "ITERS iters in" (both sides print both).
rxe_output_ok() {
    local case=$1 size=$3 iters=$4 out=$5
    if grep -Eqi "couldn't|failed|unable|error|invalid data|status|mismatch" <<<"$out"; then
        return 1
    fi
    case "$case" in
    pingpong)
        grep -Eq "^$((2 * size * iters)) bytes in " <<<"$out" &&
            grep -Eq "^$iters iters in " <<<"$out"
        ;;
    *) rxe_result_row "$size" "$iters" "$out" ;;
    esac
}

# rxe_result_row SIZE ITERS OUTPUT: a perftest result row for SIZE bytes x ITERS.
rxe_result_row() {
    grep -Eq "^ *$1 +$2 +[0-9]" <<<"$3"
}
