from vgpud.cli import app

app()
