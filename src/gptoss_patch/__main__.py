from gptoss_patch import interrupts

interrupts.install()  # before the CLI's imports: a signal from the first moment on ends with one line and 128+N

from gptoss_patch.cli import main  # noqa: E402

main()
