from arxtune.cli import main

main()
