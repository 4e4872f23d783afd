// Package openai holds the OpenAI-compatible wire types that the router and
// the workers share: request parsing and validation for /v1/completions and
// /v1/chat/completions, the response and streaming-chunk shapes, the model
// list, the error body, and a server-sent-events writer.
//
// It deliberately has no HTTP server and no model code, so that both sides of
// a router/worker hop agree on one definition of the wire format.
//
// # Compatibility
//
// Beyond OpenAI's own parameters, requests may use the vLLM/SGLang extensions
// top_k, min_p, stop_token_ids and ignore_eos, and prompts given as token ids.
// Unknown fields are ignored, since clients send options meant for other
// servers. Known features the engine lacks are rejected with a 400 naming the
// field instead of being ignored, because ignoring them would return a
// different kind of answer than the one asked for: n or best_of other than 1,
// echo, suffix, non-zero presence/frequency penalties, repetition_penalty
// other than 1, a non-empty logit_bias, tools or functions, and a
// response_format other than text. Batched prompts are rejected likewise.
package openai
