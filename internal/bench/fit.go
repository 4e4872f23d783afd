package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// fitPrompts cuts each prompt (a list of at least n words) to the most
// words that the server, asked through its /tokenize (baton's, vLLM's and
// SGLang's shape), counts as n tokens or fewer, so that --input-len means
// tokens on the model under test: a vocabulary that splits words (the
// bundled stories260K makes about three tokens of one) would otherwise
// turn 256 words into some 750 tokens. ok is false, with the prompts left
// at n words, when the server has no such route.
func fitPrompts(ctx context.Context, client *http.Client, base string, cfg Config, prompts [][]string) (out []string, ok bool, err error) {
	count := func(words []string) (int, error) { return tokenCount(ctx, client, base, cfg, strings.Join(words, " ")) }
	if _, err := count(prompts[0][:1]); err != nil {
		out = make([]string, len(prompts))
		for i, ws := range prompts {
			out[i] = strings.Join(ws[:cfg.InputLen], " ")
		}
		return out, false, nil
	}
	out = make([]string, len(prompts))
	errs := make([]error, len(prompts))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(cfg.Concurrency, len(prompts)) {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = fit(prompts[i], cfg.InputLen, count)
			}
		})
	}
	for i := range prompts {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, true, fmt.Errorf("measuring prompts with %s/tokenize: %w", base, err)
	}
	return out, true, nil
}

// fit finds by bisection the most words of ws whose text counts n tokens
// or fewer (one word at least: a prompt is never empty).
func fit(ws []string, n int, count func([]string) (int, error)) (string, error) {
	lo, hi := 1, len(ws) // lo fits or is the floor; the answer is in [lo, hi]
	if c, err := count(ws); err != nil {
		return "", err
	} else if c <= n {
		lo = hi
	}
	for lo < hi {
		mid := (lo + hi + 1) / 2
		c, err := count(ws[:mid])
		if err != nil {
			return "", err
		}
		if c <= n {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return strings.Join(ws[:lo], " "), nil
}

// tokenCount asks the server how many tokens text is as a completion's
// prompt (special tokens included, as the completion's usage counts them).
func tokenCount(ctx context.Context, client *http.Client, base string, cfg Config, text string) (int, error) {
	body, _ := json.Marshal(map[string]any{"model": cfg.Model, "prompt": text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer drainClose(resp.Body)
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, errorMessage(b))
	}
	var r struct {
		Count  *int    `json:"count"`
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, fmt.Errorf("not a /tokenize answer: %w", err)
	}
	if r.Count != nil {
		return *r.Count, nil
	}
	if r.Tokens == nil {
		return 0, errors.New("not a /tokenize answer: no count or tokens")
	}
	return len(r.Tokens), nil
}
