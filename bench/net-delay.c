/*
 * net-delay: the propagation delay of bench/shaped-link.ts's link. Every packet the netfilter
 * NFQUEUE queue <queue> gets (libnetfilter_queue, metadata only, GSO packets whole) is held
 * <delay_us> microseconds from its arrival, then accepted, in arrival order: a fixed delay on
 * every packet, as netem's `delay` (this machine's kernel has no sch_netem). The rules that feed
 * the queue are the namespace's own (bench/shaped-link.ts). Prints "ready" once bound; runs
 * until killed.
 *
 *   net-delay <queue> <delay_us>
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#define CAP (1u << 20) /* packets held at most; more are accepted at once */

static uint32_t ids[CAP];
static uint64_t due[CAP];
static uint64_t head, tail, delay_ns;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *m, struct nfq_data *d, void *x) {
  (void)m;
  (void)x;
  struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(d);
  uint32_t id = ntohl(ph->packet_id);
  if (tail - head == CAP) return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
  ids[tail % CAP] = id;
  due[tail % CAP] = now_ns() + delay_ns;
  tail++;
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: net-delay <queue> <delay_us>\n");
    return 2;
  }
  delay_ns = (uint64_t)strtoull(argv[2], NULL, 10) * 1000u;
  struct nfq_handle *h = nfq_open();
  if (!h) return perror("nfq_open"), 1;
  nfq_unbind_pf(h, AF_INET);
  if (nfq_bind_pf(h, AF_INET) < 0) return perror("nfq_bind_pf"), 1;
  struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)atoi(argv[1]), &on_packet, NULL);
  if (!qh) return perror("nfq_create_queue"), 1;
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) return perror("nfq_set_mode"), 1;
  nfq_set_queue_maxlen(qh, 200000);
  nfq_set_queue_flags(qh, NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 64u << 20);
  int fd = nfq_fd(h);
  printf("ready\n");
  fflush(stdout);
  static char buf[1 << 16];
  for (;;) {
    struct timespec wait, *tw = NULL;
    if (head < tail) {
      uint64_t n = now_ns(), d = due[head % CAP];
      uint64_t w = d > n ? d - n : 0;
      wait.tv_sec = (time_t)(w / 1000000000u);
      wait.tv_nsec = (long)(w % 1000000000u);
      tw = &wait;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = ppoll(&p, 1, tw, NULL);
    if (r < 0 && errno != EINTR) return perror("ppoll"), 1;
    if (r > 0)
      for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (errno == ENOBUFS) continue; /* the kernel dropped messages: their packets stay queued until the fail-open */
          return perror("recv"), 1;
        }
        nfq_handle_packet(h, buf, (int)k);
      }
    /* every packet due: one batch verdict accepts every id up to the last due one (ids rise in arrival order) */
    uint64_t n = now_ns();
    if (head < tail && due[head % CAP] <= n) {
      while (head < tail && due[head % CAP] <= n) head++;
      nfq_set_verdict_batch(qh, ids[(head - 1) % CAP], NF_ACCEPT);
    }
  }
}
