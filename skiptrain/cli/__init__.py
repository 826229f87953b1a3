"""The command line: LightningCLI and the Trainer with skiptrain's own subcommands.

Importing it installs the quiet start (:mod:`skiptrain.cli.quiet`) before any command imports the packages whose
notices it drops.
"""

from skiptrain.cli.quiet import silence_third_party_noise

silence_third_party_noise()
