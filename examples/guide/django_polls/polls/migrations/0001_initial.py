from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    # tuples: Django copies both into lists of its own, and nothing shares a mutable one
    dependencies = ()
    operations = (
        migrations.CreateModel(
            name="Vote",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("choice", models.CharField(max_length=100)),
            ],
        ),
    )
