"""The runtime guard in every vLLM process, and the environments that carry it.

    plugin.py     the guard itself: a `vllm.general_plugins` entry point, standard library only, copied
                  verbatim into the target's site-packages (it runs where gptoss-patch is not installed)
    installer.py  `hook install | uninstall | status`: writes the plugin, its expectation and its dist-info
    venv.py       `venv create`: a virtualenv with vLLM, gptoss-patch, the patches and the hook

Nothing is imported here, so importing one module never loads the others (the plugin's source is also
read as text by target.py and verify/probes, never imported there).
"""
