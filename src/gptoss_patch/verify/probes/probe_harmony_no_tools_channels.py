"""Probe for harmony_no_tools_channels: the installed get_system_message's valid channels.

Without custom tools `commentary` must not be a valid channel (known issue G04); with custom tools it
must stay. The harmony SystemContent is inspected directly, so no vocabulary is needed.
"""

REQUIRES = ("vllm", "openai_harmony")


def run(verbose):
    from vllm.entrypoints.openai.parser import harmony_utils

    without = _channels(harmony_utils, with_custom_tools=False)
    with_tools = _channels(harmony_utils, with_custom_tools=True)
    seen = "valid channels without custom tools: {}; with custom tools: {}".format(", ".join(without), ", ".join(with_tools))
    detail = seen if verbose else ""
    if "commentary" in without:
        return {"passed": False, "evidence": "`commentary` is still valid without custom tools (G04); " + seen, "detail": detail}
    if "commentary" not in with_tools:
        return {"passed": False, "evidence": "`commentary` was removed even with custom tools; " + seen, "detail": detail}
    return {"passed": True, "evidence": seen, "detail": detail}


def _channels(harmony_utils, with_custom_tools):
    content = harmony_utils.get_system_message(with_custom_tools=with_custom_tools).content[0]
    config = content.channel_config
    return list(config.valid_channels) if config is not None else []
