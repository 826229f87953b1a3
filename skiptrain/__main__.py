from skiptrain.cli.app import main

main()
