//go:build ucx

// The C side of the ucx transport: thin wrappers that keep UCX structs
// and status pointers out of Go. See engine.go.

#define _GNU_SOURCE
#include "bt.h"

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

ucs_status_t bt_ctx_init(const char *tls, const char *devs, ucp_context_h *out, char *err, size_t errlen) {
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_config_read: %s", ucs_status_string(st));
		return st;
	}
	if (tls[0]) {
		st = ucp_config_modify(cfg, "TLS", tls);
		if (st != UCS_OK) {
			snprintf(err, errlen, "UCX_TLS=%s: %s", tls, ucs_status_string(st));
			goto out;
		}
	}
	if (devs[0]) {
		st = ucp_config_modify(cfg, "NET_DEVICES", devs);
		if (st != UCS_OK) {
			snprintf(err, errlen, "UCX_NET_DEVICES=%s: %s", devs, ucs_status_string(st));
			goto out;
		}
	}
	ucp_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
	p.mt_workers_shared = 1;
	p.name = "baton";
	st = ucp_init(&p, cfg, out);
	if (st != UCS_OK) {
		snprintf(err, errlen, "ucp_init: %s", ucs_status_string(st));
	}
out:
	ucp_config_release(cfg);
	return st;
}

ucs_status_t bt_worker_create(ucp_context_h ctx, ucp_worker_h *w, int *efd) {
	ucp_worker_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	p.thread_mode = UCS_THREAD_MODE_SINGLE;
	ucs_status_t st = ucp_worker_create(ctx, &p, w);
	if (st != UCS_OK) {
		return st;
	}
	if (ucp_worker_get_efd(*w, efd) != UCS_OK) {
		*efd = -1;
	}
	return UCS_OK;
}

// bt_wait blocks until the worker's event fd or the wake fd is readable,
// or timeout_us microseconds pass.
int bt_wait(int efd, int wakefd, int timeout_us) {
	struct pollfd fds[2];
	int n = 0;
	if (efd >= 0) {
		fds[n].fd = efd;
		fds[n].events = POLLIN;
		n++;
	}
	fds[n].fd = wakefd;
	fds[n].events = POLLIN;
	n++;
	struct timespec ts = {timeout_us / 1000000, (long)(timeout_us % 1000000) * 1000};
	int r = ppoll(fds, n, &ts, NULL);
	return r < 0 ? -errno : r;
}

ucs_status_t bt_status(ucs_status_ptr_t r, void **req) {
	*req = NULL;
	if (r == NULL) {
		return UCS_OK;
	}
	if (UCS_PTR_IS_ERR(r)) {
		return UCS_PTR_STATUS(r);
	}
	*req = r;
	return UCS_INPROGRESS;
}

ucs_status_t bt_put(ucp_ep_h ep, uintptr_t src, size_t len, uint64_t raddr, ucp_rkey_h rk, void **req) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	return bt_status(ucp_put_nbx(ep, (const void *)src, len, raddr, rk, &p), req);
}

ucs_status_t bt_ep_flush(ucp_ep_h ep, void **req) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	return bt_status(ucp_ep_flush_nbx(ep, &p), req);
}

ucs_status_t bt_ep_close(ucp_ep_h ep, int force, void **req) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	return bt_status(ucp_ep_close_nbx(ep, &p), req);
}

// bt_req_test returns the request's status, freeing it once it is done.
ucs_status_t bt_req_test(void *req) {
	ucs_status_t st = ucp_request_check_status(req);
	if (st != UCS_INPROGRESS) {
		ucp_request_free(req);
	}
	return st;
}


static void bt_ep_err(void *arg, ucp_ep_h ep, ucs_status_t st) {
	bt_ep *e = arg;
	e->status = st;
	e->failed = 1;
}

ucs_status_t bt_ep_create(ucp_worker_h w, const void *addr, int peer, bt_ep *e) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
	p.address = addr;
	p.err_mode = peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
	if (peer) {
		p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
		p.err_handler.cb = bt_ep_err;
		p.err_handler.arg = e;
	}
	return ucp_ep_create(w, &p, &e->ep);
}

int bt_ep_failed(bt_ep *e) { return e->failed; }
ucs_status_t bt_ep_status(bt_ep *e) { return e->status; }

// bt_mem_map registers (or, alloc, allocates) memory; cuda says addr is
// GPU memory, which UCX then registers with its CUDA memory domains.
ucs_status_t bt_mem_map(ucp_context_h ctx, uintptr_t addr, size_t len, int alloc, int cuda, ucp_mem_h *mh, void **base,
                        size_t *outlen) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = (void *)addr;
	p.length = len;
	if (alloc) {
		p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
		p.flags = UCP_MEM_MAP_ALLOCATE;
	}
	if (cuda) {
		p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
		p.memory_type = UCS_MEMORY_TYPE_CUDA;
	}
	ucs_status_t st = ucp_mem_map(ctx, &p, mh);
	if (st != UCS_OK) {
		return st;
	}
	ucp_mem_attr_t a;
	a.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
	st = ucp_mem_query(*mh, &a);
	if (st != UCS_OK) {
		ucp_mem_unmap(ctx, *mh);
		return st;
	}
	*base = a.address;
	*outlen = a.length;
	return UCS_OK;
}

// bt_capture runs ucp_context_print_info or ucp_ep_print_info into a
// malloc'd string (free it).
char *bt_context_info(ucp_context_h ctx) {
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (f == NULL) {
		return NULL;
	}
	ucp_context_print_info(ctx, f);
	fclose(f);
	return buf;
}

char *bt_ep_info(ucp_ep_h ep) {
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (f == NULL) {
		return NULL;
	}
	ucp_ep_print_info(ep, f);
	fclose(f);
	return buf;
}

// bt_uct_resources lists every UCT transport resource of every memory
// domain, one "tl dev type" line each (a malloc'd string; free it).
char *bt_uct_resources(void) {
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (f == NULL) {
		return NULL;
	}
	uct_component_h *comps;
	unsigned ncomps;
	if (uct_query_components(&comps, &ncomps) != UCS_OK) {
		fclose(f);
		return buf;
	}
	for (unsigned c = 0; c < ncomps; c++) {
		uct_component_attr_t ca;
		memset(&ca, 0, sizeof ca);
		ca.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
		if (uct_component_query(comps[c], &ca) != UCS_OK || ca.md_resource_count == 0) {
			continue;
		}
		uct_md_resource_desc_t *mds = calloc(ca.md_resource_count, sizeof *mds);
		ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
		ca.md_resources = mds;
		if (mds == NULL || uct_component_query(comps[c], &ca) != UCS_OK) {
			free(mds);
			continue;
		}
		for (unsigned m = 0; m < ca.md_resource_count; m++) {
			uct_md_config_t *mc;
			uct_md_h md;
			if (uct_md_config_read(comps[c], NULL, NULL, &mc) != UCS_OK) {
				continue;
			}
			ucs_status_t st = uct_md_open(comps[c], mds[m].md_name, mc, &md);
			uct_config_release(mc);
			if (st != UCS_OK) {
				continue;
			}
			uct_tl_resource_desc_t *tls;
			unsigned ntls;
			if (uct_md_query_tl_resources(md, &tls, &ntls) == UCS_OK) {
				for (unsigned t = 0; t < ntls; t++) {
					const char *ty = "other";
					switch (tls[t].dev_type) {
					case UCT_DEVICE_TYPE_NET: ty = "net"; break;
					case UCT_DEVICE_TYPE_SHM: ty = "shm"; break;
					case UCT_DEVICE_TYPE_ACC: ty = "acc"; break;
					case UCT_DEVICE_TYPE_SELF: ty = "self"; break;
					default: break;
					}
					fprintf(f, "%s %s %s\n", tls[t].tl_name, tls[t].dev_name, ty);
				}
				uct_release_tl_resource_list(tls);
			}
			uct_md_close(md);
		}
		free(mds);
	}
	uct_release_component_list(comps);
	fclose(f);
	return buf;
}

// bt_ctx_cuda_memory says whether the context can register and move CUDA
// device memory (its memory domains include one for UCS_MEMORY_TYPE_CUDA):
// what the build and the host allow, asked of UCX rather than assumed.
int bt_ctx_cuda_memory(ucp_context_h ctx) {
	ucp_context_attr_t a;
	memset(&a, 0, sizeof a);
	a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
	if (ucp_context_query(ctx, &a) != UCS_OK) {
		return 0;
	}
	return (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}
