from crater.cli.main import app

app()
