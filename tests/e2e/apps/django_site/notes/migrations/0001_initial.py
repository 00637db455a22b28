from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    # tuples: Django copies both into lists of its own
    dependencies = ()
    operations = (
        migrations.CreateModel(
            name="Note",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("text", models.CharField(max_length=200)),
            ],
        ),
    )
