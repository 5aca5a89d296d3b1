from gptoss_patch.cli import main

main()
