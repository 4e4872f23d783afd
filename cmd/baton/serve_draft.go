package main

import (
	"fmt"
	"slices"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
)

// loadDraft loads the draft model of --speculative-algorithm draft (nil
// otherwise, and on a prefill worker, which never decodes) and refuses one
// whose tokens mean something else than the target's.
func loadDraft(f *serveFlags, be kernels.Backend, target *model.Model, tok *tokenizer.Tokenizer, dt dummyDType) (*model.Model, error) {
	if f.specAlgorithm != "draft" || f.role == "prefill" {
		return nil, nil
	}
	l, err := model.Load(dt.loadOptions(model.LoadOptions{Path: f.specDraftPath, Format: f.specDraftFormat, HostCopy: f.hostCopy(be)}), be)
	if err != nil {
		return nil, fmt.Errorf("--speculative-draft-model-path: %w", err)
	}
	var dtok *tokenizer.Tokenizer
	if l.Dir != "" {
		dtok, err = tokenizer.FromHFDir(l.Dir)
	} else {
		dtok, err = tokenizer.FromGGUF(l.GGUF)
	}
	if err == nil {
		err = scheduler.CheckDraft(&target.Config, &l.Model.Config)
	}
	if err == nil {
		err = sameTokens(tok, dtok)
	}
	if err != nil {
		l.Model.Close()
		return nil, fmt.Errorf("--speculative-draft-model-path %s: %w", f.specDraftPath, err)
	}
	return l.Model, nil
}

// sameTokens refuses a draft tokenizer whose ids are not the target's: the
// vocabulary (every token's text, in order) and the special tokens must be
// the same. The chat template and the normaliser may differ: the draft
// only ever sees ids.
func sameTokens(target, draft *tokenizer.Tokenizer) error {
	if a, b := target.VocabSize(), draft.VocabSize(); a != b {
		return fmt.Errorf("the draft's tokenizer has %d tokens, the model's %d: a draft must share the model's tokenizer", b, a)
	}
	for _, s := range []struct {
		name string
		a, b int32
	}{{"BOS", target.BOS(), draft.BOS()}, {"EOS", target.EOS(), draft.EOS()}, {"EOT", target.EOT(), draft.EOT()}} {
		if s.a != s.b {
			return fmt.Errorf("the draft's %s token is id %d, the model's %d", s.name, s.b, s.a)
		}
	}
	if a, b := target.EOGs(), draft.EOGs(); !slices.Equal(a, b) {
		return fmt.Errorf("the draft's end-of-generation tokens are %v, the model's %v", b, a)
	}
	for id := range int32(target.VocabSize()) {
		if a, b := target.TokenText(id), draft.TokenText(id); a != b {
			return fmt.Errorf("token %d is %q in the draft's tokenizer, %q in the model's", id, b, a)
		}
	}
	return nil
}

// draftPool makes the draft model's KV pool: as many pages as the model's,
// of the same size, in the draft's layout, so that every request the
// model's pool admits finds draft pages too.
func (le *loadedEngine) draftPool(kvdt kernels.DType, poison bool) error {
	c := &le.draftModel.Config
	pc := kvpool.Config{NumPages: le.plan.pages, PageSize: le.plan.pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, KVDType: kvdt, Poison: poison, Guards: guards.pool}
	if a, ok := le.backend.(kernels.KVAllocator); ok {
		layout := kernels.PagedKV{PageSize: pc.PageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: kvdt}
		dev, err := a.AllocKV(layout, pc.NumPages)
		if err != nil {
			return fmt.Errorf("draft KV pool of %d pages: %w", pc.NumPages, err)
		}
		le.draftKV, pc.Device = dev, dev
	}
	pool, err := kvpool.New(pc)
	if err != nil {
		return fmt.Errorf("draft KV pool: %w", err)
	}
	le.draft = &scheduler.DraftModel{Model: le.draftModel, Pool: pool}
	le.log.Info("draft model", "arch", c.Arch, "params", le.draftModel.Weights.Params(), "layers", c.Layers, "kv_heads", c.KVHeads,
		"vocab", c.Vocab, "kv_pool_bytes", int64(pc.NumPages)*int64(pool.PageBytes()))
	return nil
}

// spec is the engine's speculative decoding setting on role: a prefill
// engine never decodes, so it drafts nothing.
func (le *loadedEngine) spec(f *serveFlags, role scheduler.Role) scheduler.SpecConfig {
	s := f.spec()
	if role == scheduler.RolePrefill {
		return scheduler.SpecConfig{}
	}
	s.Draft = le.draft
	return s
}
