"""The runtime guard in every vLLM process.

    plugin.py     the guard itself: a `vllm.general_plugins` entry point, standard library only, copied
                  verbatim into the target's site-packages (it runs where gptoss-patch is not installed)
    installer.py  `hook install | uninstall | status`: writes the plugin, its expectation and its dist-info

(`venv create`, which builds an environment carrying the hook, is the package gptoss_patch.provision.)

Nothing is imported here, so importing one module never loads the others (the plugin's source is also
read as text by target.py and verify/probes, never imported there).
"""
