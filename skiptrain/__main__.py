from skiptrain.cli import main

main()
