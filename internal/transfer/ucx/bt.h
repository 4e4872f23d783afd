// Declarations shared by the ucx transport's Go files and bt.c.
#ifndef BATON_UCX_BT_H
#define BATON_UCX_BT_H

#include <stdint.h>
#include <stdlib.h>
#include <ucp/api/ucp.h>

// bt_ep is an endpoint and what its error handler saw.
typedef struct {
	ucp_ep_h ep;
	volatile int failed;
	ucs_status_t status;
} bt_ep;

ucs_status_t bt_ctx_init(const char *tls, const char *devs, ucp_context_h *out, char *err, size_t errlen);
ucs_status_t bt_worker_create(ucp_context_h ctx, ucp_worker_h *w, int *efd);
int bt_wait(int efd, int wakefd, int timeout_us);
ucs_status_t bt_put(ucp_ep_h ep, uintptr_t src, size_t len, uint64_t raddr, ucp_rkey_h rk, void **req);
ucs_status_t bt_ep_flush(ucp_ep_h ep, void **req);
ucs_status_t bt_ep_close(ucp_ep_h ep, int force, void **req);
ucs_status_t bt_req_test(void *req);
ucs_status_t bt_ep_create(ucp_worker_h w, const void *addr, int peer, bt_ep *e);
int bt_ep_failed(bt_ep *e);
ucs_status_t bt_ep_status(bt_ep *e);
ucs_status_t bt_mem_map(ucp_context_h ctx, uintptr_t addr, size_t len, int alloc, int cuda, ucp_mem_h *mh, void **base, size_t *outlen);
int bt_ctx_cuda_memory(ucp_context_h ctx);
char *bt_context_info(ucp_context_h ctx);
char *bt_ep_info(ucp_ep_h ep);
char *bt_uct_resources(void);

#endif
