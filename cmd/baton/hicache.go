package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/batonlm/baton/internal/hicache"
	"github.com/batonlm/baton/internal/hicache/filestore"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
)

// hicacheFlags are the hierarchical cache's settings (SGLang's names).
type hicacheFlags struct {
	size        float64 // L2, GiB of host memory; 0: no L2
	policy      string
	backend     string // L3: "" (none) or file
	dir         string
	keyFile     string  // L3's key; "": DIR.key beside --hicache-storage-dir
	storageSize float64 // L3, GiB
}

func (h *hicacheFlags) register(fs *pflag.FlagSet) {
	fs.Float64Var(&h.size, "hicache-size", 0, "standalone, prefill, decode: GiB of host memory for the prefix cache's second tier (L2): pages evicted from the KV pool go there and are loaded back on a hit; 0 turns the tiers off unless --hicache-storage-backend is set")
	fs.StringVar(&h.policy, "hicache-write-policy", "write_through", "standalone, prefill, decode: when a cached page is copied to L2: write_through (when it is published) | write_back (when the pool evicts it)")
	fs.StringVar(&h.backend, "hicache-storage-backend", "", "standalone, prefill, decode: the third tier (L3), where L2 evicts to: file (pages as files under --hicache-storage-dir, reused after a restart with the same model, layout and dtype)")
	fs.StringVar(&h.dir, "hicache-storage-dir", "", "standalone, prefill, decode: directory of --hicache-storage-backend file")
	fs.StringVar(&h.keyFile, "hicache-storage-key-file", "", "standalone, prefill, decode: file of the 32-byte key the L3 page files are sealed with (mode 0600, outside the directory); default DIR.key beside --hicache-storage-dir, created at first start")
	fs.Float64Var(&h.storageSize, "hicache-storage-size", 16, "standalone, prefill, decode: GiB the file store may hold before it evicts its oldest pages")
}

func (h *hicacheFlags) on() bool { return h.size > 0 || h.backend != "" }

// check refuses settings that cannot work, before anything is loaded.
func (h *hicacheFlags) check(f *serveFlags) error {
	if _, err := hicache.ParsePolicy(h.policy); err != nil {
		return fmt.Errorf("--hicache-write-policy: %w", err)
	}
	switch {
	case h.size < 0 || h.storageSize <= 0:
		return errors.New("--hicache-size must not be negative, --hicache-storage-size must be positive")
	case h.backend != "" && h.backend != "file":
		return fmt.Errorf("unknown --hicache-storage-backend %q (file)", h.backend)
	case h.backend == "file" && h.dir == "":
		return errors.New("--hicache-storage-backend file needs --hicache-storage-dir")
	case h.backend == "" && h.dir != "":
		return errors.New("--hicache-storage-dir needs --hicache-storage-backend file")
	case h.backend == "" && h.keyFile != "":
		return errors.New("--hicache-storage-key-file needs --hicache-storage-backend file")
	case !h.on():
		return nil
	case (f.role == "standalone" || f.role == "prefill") && f.noRadixCache:
		return errors.New("--hicache-size and --hicache-storage-backend are tiers of the prefix cache, which --disable-radix-cache turns off")
	case f.role == "decode" && !f.decodeRadix:
		return errors.New("on decode, --hicache-size and --hicache-storage-backend need --disaggregation-decode-enable-radix-cache")
	}
	return nil
}

// openFileStore opens L3 for --hicache-storage-backend file: the store of
// internal/hicache/filestore, which checks every file against meta (a
// file of another model, layout or dtype is foreign: counted, never
// read) and against its key (a file that fails its MAC is removed and
// counted in forged). It returns the store, its size in bytes for the
// gauge, and what closes it.
//
// The key is the store's own, in a file, rather than derived from the
// cluster secret: a standalone server has no secret, and a worker's L3 is
// local to it, so no other member needs the key.
func openFileStore(dir, keyFile string, meta hicache.Meta, capacity int64, forged prometheus.Counter) (hicache.Store, func() int64, io.Closer, error) {
	opts := []filestore.Option{filestore.OnForged(forged.Inc)}
	if keyFile != "" {
		opts = append(opts, filestore.WithKeyFile(keyFile))
	}
	st, err := filestore.Open(dir, filestore.Meta{Fingerprint: meta.Fingerprint, Layout: meta.Layout, DType: meta.DType}, capacity, opts...)
	switch {
	case errors.Is(err, filestore.ErrKeyFile) && keyFile != "":
		return nil, nil, nil, fmt.Errorf("--hicache-storage-key-file: %w", err)
	case err != nil:
		return nil, nil, nil, fmt.Errorf("--hicache-storage-dir: %w", err)
	}
	return st, func() int64 { return st.Stats().Bytes }, st, nil
}

// tiers sets the lower tiers up under cache; close stops their loaders
// (after the engine stopped) and closes L3.
func (le *loadedEngine) tiers(f *serveFlags, cache *prefixcache.Cache, ms *metrics.Set) (t *hicache.Tiers, closeFn func(), err error) {
	h := &f.hicache
	if cache == nil || !h.on() {
		return nil, func() {}, nil
	}
	cfg := hicache.Config{Pool: le.pool, Cache: cache, HostBytes: int64(h.size * (1 << 30)), Policy: hicache.Policy(h.policy), Metrics: ms, Faults: guards.tiers}
	var closer io.Closer
	if h.backend == "file" {
		meta := hicache.MetaOf(le.pool, le.fingerprint(f))
		if cfg.Store, cfg.StoreBytes, closer, err = openFileStore(h.dir, h.keyFile, meta, int64(h.storageSize*(1<<30)), ms.HiCacheL3Forged); err != nil {
			return nil, nil, err
		}
	}
	if t, err = hicache.New(cfg); err != nil {
		if closer != nil {
			_ = closer.Close()
		}
		return nil, nil, err
	}
	if le.devKV != nil {
		// The L2 region is Go memory; page copies to and from the device
		// go through the pool's page-locked staging buffer when the driver
		// gave one (the backend has no pinned region to offer L2 itself).
		le.log.Info("hicache: L2 is pageable host memory; device copies stage through the pool's pinned page buffer")
	}
	le.log.Info("hicache", "l2_bytes", cfg.HostBytes, "write_policy", h.policy, "l3", h.backend, "l3_dir", h.dir)
	return t, func() {
		t.Close()
		if closer != nil {
			_ = closer.Close()
		}
	}, nil
}
